"""Chunks found again after their files moved: a source's folder moved, copied to another machine, or reached
through a link gives its files other paths, so its chunks other keys, while the chunks are still in the build root
under their old keys.

:func:`relocate_chunks` finds such a chunk by its content key (:func:`mixing.ingest.chunks.content_key`) and
writes it under the new key instead of tokenizing it again: its ``tokens.bin`` linked (or copied within the store)
unread, its ``docs.parquet`` and ``quarantine.jsonl`` the old ones with each moved file's path replaced by its new
one, its ``report.json`` last (the chunk's commit record, as for a tokenized chunk), keeping the sha256 the old
report recorded for the tokens. The old folder stays until the caller removes chunks no group claims.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from contract.store import Store
from mixing.ingest.chunk_store import check_chunk, chunk_reports
from mixing.ingest.chunks import (
    CHUNK_FILES,
    CHUNK_SCHEMA,
    INDEX_ROWS,
    REPORT,
    ChunkDamaged,
    Group,
    content_key,
    describe_files,
    quarantine_line,
    write_report,
)
from mixing.ingest.sources import file_name
from mixing.ingest.tokenizer import TextTokenizer
from mixing.mixfile.mix import SourceSpec

__all__ = ["relocate_chunks"]


def relocate_chunks(
    chunks: Store,
    groups: list[tuple[Group, str]],
    present: set[str],
    tokenizer: TextTokenizer,
    spec: SourceSpec,
    busy: Callable[[str], bool] = lambda _key: False,
) -> list[str]:
    """Write each chunk of ``groups`` (rows, key) missing from ``chunks`` whose documents are there under another
    key (one of ``present``, the keys listed there, that no group has); return the keys written.

    A chunk's old key is found by content: among the chunks no group claims, one whose files have the same names
    and sizes (from its report), then the same :func:`~mixing.ingest.chunks.content_key` (the missing chunk's
    files hashed here: a read at disk speed, and only for chunks with such a candidate). It is written under the
    new key with its ``docs.parquet`` and ``quarantine.jsonl`` naming the files' paths now (a ``code`` source's
    ``meta`` path too), its ``tokens.bin`` linked or copied unread, and the sha256 its old report recorded for
    the tokens kept, so the usual check of a reused chunk still catches damage. A candidate whose report, docs or
    quarantine do not match their checksums, or that cannot be written anew, is left alone (the chunk is then
    tokenized). The old folder stays
    until the caller removes chunks no group claims. Keys ``busy`` says are being written elsewhere (tokenized
    ahead) are skipped. Digests hashed here are kept in the rows (``digest``), so tokenizing a chunk that found
    no match does not hash its files again.
    """
    claimed = {k for _g, k in groups}
    missing = [(g, k) for g, k in groups if k not in present and not busy(k)]
    orphans = sorted(present - claimed)
    if not missing or not orphans:
        return []
    by_shape: dict[tuple[tuple[str, int], ...], list[tuple[str, dict[str, Any]]]] = {}
    for key, rep in chunk_reports(chunks, orphans).items():
        files = rep.get("files")
        if rep.get("content") and isinstance(files, list):
            by_shape.setdefault(tuple((f["name"], f["size"]) for f in files), []).append((key, rep))
    found = [(g, k, by_shape[_shape(g)]) for g, k in missing if _shape(g) in by_shape]
    if not found:
        return []
    with ThreadPoolExecutor(min(8, os.cpu_count() or 1)) as pool:
        described = list(pool.map(describe_files, [g for g, _k, _c in found]))
    written: list[str] = []
    taken: set[str] = set()
    for (group, key, candidates), files in zip(found, described, strict=True):
        for row, f in zip(group, files, strict=True):
            row["digest"] = f["digest"]
        want = content_key(files, tokenizer, spec)
        for old, rep in candidates:
            if want is None or old in taken or rep["content"] != want:
                continue
            try:
                _relocate(chunks, old, key, rep, files, spec)
            except (ChunkDamaged, OSError):  # not a sound copy, or the store refused: tokenized instead
                continue
            taken.add(old)
            written.append(key)
            break
    return written


def _shape(group: Group) -> tuple[tuple[str, int], ...]:
    return tuple((file_name(row), row.get("size") or 0) for row in group)


def _relocate(
    chunks: Store, old: str, new: str, report: dict[str, Any], files: list[dict[str, Any]], spec: SourceSpec
) -> None:
    """Write chunk ``old`` (its checked ``report``) again as chunk ``new`` of ``files`` (the same names and
    contents, at other paths): documents and quarantine naming the new paths, tokens carried over unread, the
    report last. Raises :class:`ChunkDamaged` when ``old``'s docs or quarantine do not match their checksums."""
    moved = {a["path"]: b["path"] for a, b in zip(report["files"], files, strict=True) if a["path"] != b["path"]}
    kept = {k: v for k, v in report.items() if k not in ("sha256", "check")}
    tokens_sum = {"tokens.bin": report["sha256"]["tokens.bin"]}
    with tempfile.TemporaryDirectory(prefix="weir-relocate-") as scratch:
        read = Path(scratch) / "read"
        read.mkdir()
        c = check_chunk(chunks, old, tokens=False, into=read)
        assert c.docs is not None and c.quarantine is not None, "check_chunk(into=...) gives both files"
        if chunks.local:  # beside its place, renamed into it whole, as a tokenized chunk is
            folder = chunks.path / f".{new}.{os.getpid()}.tmp"
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
        else:
            folder = Path(scratch) / "write"
            folder.mkdir()
        try:
            _rewrite_paths(c.docs, c.quarantine, folder, moved, spec)
            if chunks.local:
                try:  # the tokens do not change: a hard link, as a seeded build folder holds them
                    os.link(chunks.path / old / "tokens.bin", folder / "tokens.bin")
                except OSError:
                    shutil.copyfile(chunks.path / old / "tokens.bin", folder / "tokens.bin")
                write_report(folder, {**kept, "files": files}, known=tokens_sum)
                shutil.rmtree(chunks.path / new, ignore_errors=True)
                os.replace(folder, chunks.path / new)
                return
            chunks.fs.copy(chunks.key(f"{old}/tokens.bin"), chunks.key(f"{new}/tokens.bin"))  # within the store
            write_report(folder, {**kept, "files": files}, known=tokens_sum)
            for name in CHUNK_FILES[1:]:
                chunks.put_file(f"{new}/{name}", folder / name)
            chunks.put_file(f"{new}/{REPORT}", folder / REPORT)  # last: the chunk exists from here on
        except BaseException:
            if chunks.local:
                shutil.rmtree(folder, ignore_errors=True)
            raise


def _rewrite_paths(docs: Path, quarantine: Path, folder: Path, moved: dict[str, str], spec: SourceSpec) -> None:
    """``docs`` and ``quarantine`` written into ``folder`` with each path of ``moved`` replaced by its new one:
    the documents' ``file``, the quarantine records' ``file``, and the ``path`` a ``code`` source's ``meta``
    gives a file of its own (a tar member's path, inside the archive, stays). Streamed: a row group of
    :data:`~mixing.ingest.chunks.INDEX_ROWS` rows and one quarantine line at a time, as the index is written."""
    schema = pl.DataFrame(schema=CHUNK_SCHEMA).to_arrow().schema
    with pq.ParquetWriter(folder / "docs.parquet", schema) as writer:
        for batch in pq.ParquetFile(docs).iter_batches(batch_size=INDEX_ROWS, columns=list(CHUNK_SCHEMA)):
            part = pl.from_arrow(batch)
            assert isinstance(part, pl.DataFrame)
            if moved and spec.format == "code":
                metas = [_code_meta(m, f, moved) for m, f in zip(part["meta"], part["file"], strict=True)]
                part = part.with_columns(pl.Series("meta", metas, pl.String))
            if moved:
                part = part.with_columns(pl.col("file").replace(moved))
            writer.write_table(part.to_arrow().cast(schema))
    with quarantine.open("rb") as src, (folder / "quarantine.jsonl").open("wb") as dst:
        for line in src:  # split at b"\n" only: U+2028 and friends may be inside a string
            if moved and line.strip(b"\n"):
                row = json.loads(line)
                if row.get("file") in moved:
                    row["file"] = moved[row["file"]]
                    line = quarantine_line(row).encode() + b"\n"
            dst.write(line)


def _code_meta(meta: str | None, file: str, moved: dict[str, str]) -> str | None:
    """A ``code`` document's ``meta`` with the path of its own file (``{"path": file, ...}``) moved."""
    if meta is None or file not in moved:
        return meta
    head = '{"path": ' + json.dumps(file) + ","
    return '{"path": ' + json.dumps(moved[file]) + "," + meta[len(head) :] if meta.startswith(head) else meta
