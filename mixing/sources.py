"""Source index: the files a source's URI matches, each with a fingerprint, and reading their records."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass

import fsspec
import polars as pl

from mixing.errors import WeirError
from mixing.mixfile import Mix, SourceSpec

__all__ = ["Record", "SourceIndexError", "index_source", "read_records"]


class SourceIndexError(WeirError, RuntimeError):
    """A source whose URI matches no file, or whose storage cannot be listed."""


@dataclass(frozen=True)
class Record:
    """One record of a source file: ``text`` (after the template), or ``error`` when it is malformed.

    ``line`` is the 1-based line (jsonl) or 0 for a whole-file document.
    """

    file: str
    line: int
    text: str | None
    error: str | None = None


def index_source(mix: Mix, name: str) -> pl.DataFrame:
    """List the files of source ``name`` with a fingerprint each.

    Returns columns ``path`` (full URI, sorted), ``size`` (bytes), ``fingerprint`` (hex of size + mtime or
    etag). Deterministic for unchanged storage. Raises :class:`SourceIndexError` when nothing matches.
    """
    uri = mix.source_uri(name)
    fs, pattern = fsspec.core.url_to_fs(uri)
    files = sorted(p for p in fs.glob(pattern) if fs.isfile(p)) if fs.exists(pattern) or _is_glob(pattern) else []
    if not files:
        raise SourceIndexError(
            f"source {name!r}: no file matches {uri!r}; expected at least one "
            "(for the demo mix, run `weir demo-data` first)"
        )
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    rows = []
    for p in files:
        info = fs.info(p)
        stamp = info.get("ETag") or info.get("mtime") or info.get("LastModified") or ""
        fp = hashlib.sha256(f"{info.get('size')}|{stamp}".encode()).hexdigest()[:16]
        full = p if protocol in ("file", "local") else f"{protocol}://{p}"
        rows.append({"path": full, "size": int(info.get("size") or 0), "fingerprint": fp})
    return pl.DataFrame(rows, schema={"path": pl.String, "size": pl.Int64, "fingerprint": pl.String})


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def read_records(path: str, spec: SourceSpec) -> Iterator[Record]:
    """Yield the records of one file in order; malformed ones carry ``error`` instead of ``text``."""
    with fsspec.open(path, "rb", compression="infer") as f:
        raw = f.read()
    if spec.format == "text":
        try:
            yield Record(path, 0, raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            yield Record(path, 0, None, f"invalid UTF-8 at byte {e.start}")
        return
    for i, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            yield Record(path, i, None, f"invalid JSON: {e}")
            continue
        yield _render(path, i, rec, spec)


def _render(path: str, line: int, rec: object, spec: SourceSpec) -> Record:
    if not isinstance(rec, dict):
        return Record(path, line, None, "record is not a JSON object")
    if spec.template is not None:
        try:
            return Record(path, line, spec.template.format(**rec))
        except (KeyError, IndexError, ValueError) as e:
            return Record(path, line, None, f"template field missing: {e}")
    value = rec.get(spec.field)
    if not isinstance(value, str):
        return Record(path, line, None, f"field {spec.field!r} missing or not a string")
    return Record(path, line, value)
