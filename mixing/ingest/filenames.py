"""File names as weir shows and stores them: a local name whose bytes are not UTF-8 is escaped (``caf\\xe9.txt``),
so that every index, chunk key, quarantine record and message can hold it, and opened again by its bytes."""

from __future__ import annotations

import os
import re

from mixing.ingest.records import has_surrogate

__all__ = ["real_path", "shown_path"]


def shown_path(path: str) -> str:
    """``path`` as weir shows and stores it (in an index, a chunk key, a quarantine record, a message).

    A path that is valid Unicode (every object-store key, most local names) is itself. A local name whose bytes
    are not UTF-8 (Linux hands it to Python with a lone surrogate per such byte, ``caf\\udce9.txt``, which no
    UTF-8 text, JSON or parquet file can hold) is shown escaped: each such byte as ``\\xNN``, each backslash
    doubled (``caf\\xe9.txt``). :func:`mixing.ingest.formats.read_file` opens a shown path again
    (:func:`real_path`).
    """
    if path.isascii() or not has_surrogate(path):
        return path
    try:
        raw = path.encode("utf-8", "surrogateescape")  # the name's bytes
    except UnicodeEncodeError:  # a surrogate no byte stands for: shown, but no file has that name
        return path.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


_ESCAPE = re.compile(rb"\\(\\|x[0-9a-f]{2})")


def real_path(path: str) -> str:
    """The name a path :func:`shown_path` escaped stands for; any other path is itself.

    Only a local path whose unescaped bytes are not UTF-8 can be an escaped one (a UTF-8 name is shown as
    itself). Should a file be named exactly as the escaped form (backslashes and all), that file is the one
    opened: :func:`mixing.ingest.sources.index_source` quarantines the other instead of listing one path twice.
    """
    if "\\" not in path or "://" in path or has_surrogate(path):
        return path
    raw = _ESCAPE.sub(lambda m: b"\\" if m[1] == b"\\" else bytes([int(m[1][1:], 16)]), path.encode("utf-8"))
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return path if os.path.lexists(path) else raw.decode("utf-8", "surrogateescape")
    return path
