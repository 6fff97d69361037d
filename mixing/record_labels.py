"""Record labels: how a document's ``line`` reads for the file it came from (``line 12``, ``row 3``, ...).

A document's ``line`` (in its source's ``docs.parquet``) means what the source's format made of it
(:class:`mixing.ingest.records.Record`): the 1-based line of a jsonl file, the 1-based row of a parquet or
csv file, the 1-based piece of a text file cut by a ``separator`` or member of a code ``.tar``, 0 for a
whole file (a text or code file that is one document). The build does not record the format (the mix file is
not part of it), so :func:`record_label` tells it from the file's name, compression suffix left out: ``.jsonl``,
``.json``, ``.ndjson`` → ``line N``; ``.parquet``, ``.pq``, ``.csv``, ``.tsv`` → ``row N``; a tar →
``member N (path)``; any other name → ``whole file`` for line 0, else ``piece N``. Pure: the name (case
ignored), the number and the metadata JSON decide; nothing is read.
"""

from __future__ import annotations

import json

from mixing.ingest.formats import TAR_SUFFIXES

__all__ = ["record_label"]

_COMPRESSED = (".gz", ".zst", ".bz2", ".xz")  # what the readers infer from a name (fsspec compression="infer")
_LINES = (".jsonl", ".json", ".ndjson")
_ROWS = (".parquet", ".pq", ".csv", ".tsv")


def record_label(file: str, line: int, meta: str | None = None) -> str:
    """How a document's ``line`` reads for its file (see the module's docstring): ``"line 12"``, ``"row 3"``,
    ``"piece 2"``, ``"member 4 (pkg/m.py)"`` or ``"whole file"``."""
    name = file.lower()
    for suffix in _COMPRESSED:
        if name.endswith(suffix) and not name.endswith(TAR_SUFFIXES):
            name = name[: -len(suffix)]
            break
    if name.endswith(TAR_SUFFIXES):
        path = _meta_path(meta)
        return f"member {line}" + (f" ({path})" if path else "")
    if name.endswith(_LINES):
        return f"line {line}"
    if name.endswith(_ROWS):
        return f"row {line}"
    return "whole file" if line == 0 else f"piece {line}"


def _meta_path(meta: str | None) -> str | None:
    """A code document's ``path`` from its metadata JSON (the tar member's name), else None."""
    if not meta:
        return None
    try:
        found = json.loads(meta)
    except ValueError:
        return None
    path = found.get("path") if isinstance(found, dict) else None
    return path if isinstance(path, str) else None
