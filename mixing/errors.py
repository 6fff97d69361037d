"""The base of every error weir reports to a user as a message rather than a traceback."""

__all__ = ["WeirError"]


class WeirError(Exception):
    """A problem with the user's input or data; ``str(err)`` says what, where, and what was expected."""
