"""``contract.atomic``: a reader sees the old file or the whole new one, never a part; a failed write leaves the
old file and no temporary behind (also when interrupted); new files get 0666 less the umask (``file_mode``),
never mkstemp's 0600; ``write_json_atomic`` round-trips any JSON value."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.atomic import atomic_path, file_mode, write_json_atomic

EXAMPLES = settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def leftovers(folder: Path) -> list[str]:
    """Temporary files an atomic write left in ``folder`` (its ``.NAME.*.tmp`` files)."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") and p.name.endswith(".tmp"))


def test_a_write_appears_whole_only_when_the_block_ends(tmp_path: Path) -> None:
    final = tmp_path / "deep" / "er" / "f.txt"  # missing parents are made
    with atomic_path(final) as tmp:
        assert tmp.parent == final.parent and tmp.name.startswith(f".{final.name}.") and tmp.name.endswith(".tmp")
        assert tmp.exists() and not final.exists()
        tmp.write_text("first")
    assert final.read_text() == "first" and leftovers(final.parent) == []
    with atomic_path(final) as tmp:
        tmp.write_text("second, longer")
        assert final.read_text() == "first"  # the old file, whole, until the rename
    assert final.read_text() == "second, longer" and leftovers(final.parent) == []


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
@pytest.mark.parametrize("existed", [True, False])
def test_a_failed_write_leaves_the_old_file_and_no_temporary(
    tmp_path: Path, error: type[BaseException], existed: bool
) -> None:
    final = tmp_path / "f.json"
    if existed:
        final.write_text("old")
    with pytest.raises(error), atomic_path(final) as tmp:
        tmp.write_text("half of the new")
        raise error("stop")
    assert (final.read_text() if existed else final.exists()) == ("old" if existed else False)
    assert leftovers(tmp_path) == []


def test_writers_of_one_file_at_once_never_share_a_temporary(tmp_path: Path) -> None:
    final = tmp_path / "f"
    with atomic_path(final) as a, atomic_path(final) as b, atomic_path(final) as c:
        assert len({a, b, c}) == 3
        for p, text in ((a, "a"), (b, "b"), (c, "c")):
            p.write_text(text)
    assert final.read_text() == "a"  # the last to finish wins, whole
    assert leftovers(tmp_path) == []


@EXAMPLES
@given(mask=st.integers(0, 0o777))
def test_new_files_get_0666_less_the_umask(tmp_path: Path, mask: int) -> None:
    final = tmp_path / f"f{mask:o}"
    with umask(mask):
        assert file_mode() == 0o666 & ~mask
        with atomic_path(final) as tmp:
            tmp.write_text("x")
        assert os.umask(mask) == mask  # file_mode read the umask without changing it
    assert final.stat().st_mode & 0o777 == 0o666 & ~mask


@EXAMPLES
@given(obj=JSON)
def test_write_json_atomic_round_trips_any_json_value(tmp_path: Path, obj: Any) -> None:
    final = tmp_path / "x.json"
    write_json_atomic(final, obj)
    text = final.read_text()
    assert json.loads(text) == obj and text.endswith("\n")
    assert text == json.dumps(obj, indent=2, sort_keys=True) + "\n"  # keys sorted: the same value, the same bytes


def test_write_json_atomic_of_something_not_json_keeps_the_old_file(tmp_path: Path) -> None:
    final = tmp_path / "x.json"
    write_json_atomic(final, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(final, {"a": object()})
    assert json.loads(final.read_text()) == {"a": 1} and leftovers(tmp_path) == []
