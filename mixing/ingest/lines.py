"""Line ends of the line-split formats (jsonl records, csv rows, text separators): ``\\n``, ``\\r\\n`` and a bare
``\\r`` each end a line, and a file without ``\\r`` is split exactly as ``readline`` splits it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import IO

__all__ = ["EOL", "lines", "separator_pattern"]

EOL = re.compile(rb"\r\n|\r|\n")  # a line's end: each ends a record of a line-split format


def lines(f: IO[bytes], limit: int) -> Iterator[tuple[bytes, int]]:
    """Each line of ``f``, its end kept (``\\n``, ``\\r\\n`` or ``\\r``: each ends a line; none ends the
    file's last), and 0; for a line over ``limit`` bytes without its end, its first ``limit + 1`` bytes and
    its size with its end (the rest is skipped, unread but for finding its end).

    Memory is about ``2 * limit`` bytes. Lines without a ``\\r`` come from ``readline`` as they always did,
    so a file without one is read exactly as before.
    """
    rest = b""  # read but not yet yielded: the start of a line whose end is not read yet
    head, size = b"", -1  # a line over the limit being skipped: its start and its size so far (-1: none)
    while True:
        chunk = f.readline(limit + 1)
        if not rest and size < 0 and b"\r" not in chunk:  # a line ending in \n, or the file's last
            if not chunk:
                return
            if len(chunk) > limit and not chunk.endswith(b"\n"):
                head, size = chunk, len(chunk)
            else:
                yield chunk, 0
            continue
        data, rest, pos = rest + chunk, b"", 0
        while pos < len(data):
            m = EOL.search(data, pos)
            if chunk and (m is None or (m[0] == b"\r" and m.end() == len(data))):  # the end is not read yet
                cut = len(data) if m is None else m.start()  # (a last \r may be the start of \r\n)
                if size >= 0:
                    size += cut - pos
                    rest = data[cut:]
                elif cut - pos > limit:
                    head, size = data[pos : pos + limit + 1], cut - pos
                    rest = data[cut:]
                else:
                    rest = data[pos:]
                break
            end, stop = (m.start(), m.end()) if m else (len(data), len(data))
            if size >= 0:
                yield head, size + stop - pos
                head, size = b"", -1
            elif end - pos > limit:
                yield data[pos : pos + limit + 1], stop - pos
            else:
                yield data[pos:stop], 0
            pos = stop
        if not chunk:
            if size >= 0:
                yield head, size
            return


def separator_pattern(separator: str) -> tuple[re.Pattern[bytes], bool]:
    """The pattern that splits pieces at ``separator``, and whether it holds a line end.

    Each ``\\n`` of a separator without ``\\r`` stands for any line end (``\\n``, ``\\r\\n`` or ``\\r``):
    ``"\\n\\n"`` splits at a blank line whatever the file's line ends, and a file without ``\\r`` is split as
    before. A separator that holds a ``\\r`` is taken literally.
    """
    raw = separator.encode("utf-8")
    if b"\r" in raw or b"\n" not in raw:
        return re.compile(re.escape(raw)), False
    eol = rb"(?:\r\n|\r(?!\n)|\n)"  # a \r\n is one line end, never two
    return re.compile(eol.join(re.escape(part) for part in raw.split(b"\n"))), True
