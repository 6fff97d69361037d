"""mixing.ingest.lines: each of \\n, \\r\\n and \\r ends a line, wherever a read cuts the file; a line over the
limit is its start and its full size; a file without \\r splits exactly as readline does; separators."""

from __future__ import annotations

import io
import re

from hypothesis import given
from hypothesis import strategies as st

from mixing.ingest.lines import EOL, lines, separator_pattern


def test_lines_keep_their_ends_and_a_line_over_the_limit_is_its_start_and_size() -> None:
    data = b'{"a": 1}\n' + b"x" * 50 + b"\n\n" + b'{"b": 2}'  # the last line without an end
    for end in (b"\n", b"\r\n", b"\r"):
        reader = io.BufferedReader(io.BytesIO(data.replace(b"\n", end)), 8)
        assert list(lines(reader, 20)) == [
            (b'{"a": 1}' + end, 0),
            (b"x" * 21, 50 + len(end)),
            (end, 0),
            (b'{"b": 2}', 0),
        ]


@given(st.binary(max_size=300).filter(lambda b: b"\r" not in b), st.integers(1, 64), st.integers(1, 32))
def test_a_file_without_cr_splits_as_readline_does(data: bytes, limit: int, buffer: int) -> None:
    expect = []
    f = io.BufferedReader(io.BytesIO(data), buffer)
    while raw := f.readline(limit + 1):
        if len(raw) > limit and not raw.endswith(b"\n"):
            size = len(raw)
            while (more := f.readline(1 << 20)) and not more.endswith(b"\n"):
                size += len(more)
            expect.append((raw, size + len(more)))
        else:
            expect.append((raw, 0))
    assert list(lines(io.BufferedReader(io.BytesIO(data), buffer), limit)) == expect


@given(
    st.lists(st.binary(min_size=1, max_size=20).map(lambda b: b.replace(b"\r", b"x").replace(b"\n", b"y")), max_size=8),
    st.lists(st.sampled_from([b"\n", b"\r\n", b"\r"]), min_size=8, max_size=8),
    st.integers(1, 16),
)
def test_any_mix_of_line_ends_gives_the_lines_back(texts: list[bytes], ends: list[bytes], buffer: int) -> None:
    # (lines are not empty: an empty line ended by \r before one ended by \n is a \r\n)
    data = b"".join(t + e for t, e in zip(texts, ends, strict=False))
    got = list(lines(io.BufferedReader(io.BytesIO(data), buffer), 1000))
    assert [(raw, 0) for raw in (t + e for t, e in zip(texts, ends, strict=False))] == got
    assert [m.group() for m in EOL.finditer(data)] == ends[: len(texts)]


def test_a_separator_of_newlines_matches_any_line_end_and_one_with_cr_is_literal() -> None:
    sep, eol = separator_pattern("\n\n")
    assert eol and sep.split(b"a\r\n\r\nb\r\rc\n\nd") == [b"a", b"b", b"c", b"d"]
    assert sep.split(b"a\r\nb") == [b"a\r\nb"]  # a \r\n is one line end, never two
    literal, eol = separator_pattern("\r\n---")
    assert not eol and literal.pattern == re.escape(b"\r\n---")
