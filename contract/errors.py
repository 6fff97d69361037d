"""The base of every error weir reports to a user as a message rather than a traceback, and how a cause is
quoted in one."""

__all__ = ["WeirError", "first_line"]


class WeirError(Exception):
    """A problem with the user's input or data; ``str(err)`` says what, where, and what was expected."""


def first_line(e: BaseException) -> str:
    """The first line of ``str(e)``, or the exception's type name when it says nothing: a cause quoted inside
    a one-line message."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
