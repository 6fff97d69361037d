"""``contract.errors``: ``first_line`` quotes a cause as one line (its first non-blank text, else its type's name);
``WeirError`` is the base of the errors weir reports as messages, an ``Exception`` (never a ``BaseException``
only) that the contract's own errors derive from."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.errors import WeirError, first_line
from contract.manifest import ShardError
from contract.store import StoreError


@given(text=st.text())
def test_first_line_is_one_line_of_the_message_or_the_type_name(text: str) -> None:
    got = first_line(ValueError(text))
    assert got and "\n" not in got and "\r" not in got
    if text.strip():
        assert got == text.strip().splitlines()[0] and got in text
    else:
        assert got == "ValueError"


@pytest.mark.parametrize(
    ("error", "want"),
    [
        (OSError(2, "No such file or directory"), "[Errno 2] No such file or directory"),
        (KeyError("k"), "'k'"),
        (RuntimeError(), "RuntimeError"),
        (WeirError("  \n\nsource 'qa': bad record\n  at line 3\n"), "source 'qa': bad record"),
        (KeyboardInterrupt(), "KeyboardInterrupt"),
    ],
)
def test_first_line_of_common_causes(error: BaseException, want: str) -> None:
    assert first_line(error) == want


def test_weir_errors_are_plain_exceptions_the_contracts_errors_derive_from() -> None:
    assert issubclass(WeirError, Exception)
    assert issubclass(ShardError, WeirError) and issubclass(StoreError, WeirError)
    with pytest.raises(WeirError, match=r"^what, where, expected$"):
        raise ShardError("what, where, expected")
