"""The chunk cache of a tokenized source: a source's files tokenized in chunks under ``chunks/<key>/``.

Chunks: the files are cut at stable boundaries that each file sets alone, from its name (its path below the
source's fixed folder, :func:`mixing.ingest.sources.file_name`) and its size: about :data:`_GROUP` files, or
about :data:`CHUNK_BYTES` of them, whichever comes first, and a file of :data:`CHUNK_BYTES` or more is a chunk
of its own. Changing a file's contents never moves a boundary; changing its size can only move the boundaries
beside it, never others; moving, copying or linking the source's folder elsewhere moves none. A chunk's
``key`` hashes its files' paths and fingerprints, the tokenizer's fingerprint and the source's rendering spec,
so equal keys mean equal documents and a chunk whose key is already there is reused: a rebuild after one
file changed re-tokenizes only that file's chunk.

A chunk's :func:`content_key` hashes the same but with its files' names and content digests
(:func:`mixing.ingest.sources.file_digest`) in place of their paths and fingerprints: the same documents
wherever the files are. Each chunk records it, so that when its files moved (their paths, hence its key,
changed) the chunk is found by content and renamed to its new key with the paths it names rewritten
(:func:`mixing.ingest.relocation.relocate_chunks`) instead of being tokenized again.

A chunk folder holds ``tokens.bin`` (little-endian uint32 token ids), ``docs.parquet`` (``file``, ``line``,
``n_tokens``, ``meta``: :data:`CHUNK_SCHEMA`), ``quarantine.jsonl`` (one line per malformed record) and
``report.json``, written last, holding the record counts, its files (``name``, ``path``, ``size``,
``digest``, in order) and content key, the sha256 of the three files and a checksum of itself.
:func:`mixing.ingest.chunk_store.check_chunk` verifies all of them (wherever the chunk is stored) and raises
:class:`ChunkDamaged` on any mismatch.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import numpy as np
import polars as pl

from contract.store import sha256_file
from mixing.ingest.formats import READER_VERSION
from mixing.ingest.records import Record, has_surrogate
from mixing.ingest.sources import Listed, file_digest, file_name, read_ahead, skipped_record
from mixing.ingest.tokenizer import TextTokenizer
from mixing.mixfile.mix import SourceSpec

__all__ = [
    "CHUNK_BYTES",
    "CHUNK_FILES",
    "CHUNK_SCHEMA",
    "INDEX_ROWS",
    "REPORT",
    "ChunkDamaged",
    "Described",
    "Group",
    "chunk_groups",
    "chunk_keys",
    "content_key",
    "describe_files",
    "quarantine_line",
    "tokenize_chunks",
    "write_report",
]

CHUNK_SCHEMA = {"file": pl.String, "line": pl.Int64, "n_tokens": pl.Int64, "meta": pl.String}
_BATCH_BYTES = 1 << 20  # text per encode call: large enough to keep every tokenizer thread busy
_GROUP = 128  # files per chunk, on average, when files are small: a task's fixed cost (~10-30 ms) stays small
CHUNK_BYTES = 16 << 20  # input bytes per chunk, about: a Ray task of a few seconds, however large the files
CHUNK_FILES = ("tokens.bin", "docs.parquet", "quarantine.jsonl")  # checksummed in report.json
INDEX_ROWS = 1 << 16  # rows per row group of a chunk's docs.parquet and a source's: what a reader holds at once
REPORT = "report.json"
_CHUNK_VERSION = 3  # 2: chunks carry checksums; 3: boundaries by file name, reports list files and content

Group = list[dict[str, Any]]  # rows of the source's index frame (``path``, ``fingerprint``, ``skipped``, ``name``)
Described = tuple[list[dict[str, Any]], str | None]  # a chunk's files as its report lists them, its content key


class ChunkDamaged(Exception):
    """A chunk whose files do not match the checksums its report.json recorded."""


class _Chunk:
    """One chunk being tokenized into a temporary folder, renamed to ``chunks/<key>`` when complete."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self.tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.tokens: IO[bytes] = (self.tmp / "tokens.bin").open("wb")
        self.quarantine: IO[str] = (self.tmp / "quarantine.jsonl").open("w", encoding="utf-8")
        self.missing: Counter[str] = Counter()
        self.described: Future[Described] | None = None  # hashed beside the reading, needed by finish()
        self.meta: dict[str, list[Any]] = {k: [] for k in CHUNK_SCHEMA}
        self.pending = 0  # records read but not yet encoded
        self.read_all = False
        self.seen = 0
        self.bytes_in = 0
        self.reasons: Counter[str] = Counter()

    def bad(self, rec: Record) -> None:
        self.seen += 1
        self.reasons[rec.reason or "?"] += 1
        if rec.reason == "missing field" and rec.error and rec.error.endswith(" is missing"):
            self.missing[rec.error.split(": ", 1)[1].removesuffix(" is missing")] += 1
        row = {"file": rec.file, "line": rec.line, "reason": rec.reason, "detail": rec.error, "sample": rec.sample}
        self.quarantine.write(quarantine_line(row) + "\n")

    def add(self, recs: list[Record], ids: np.ndarray, lengths: np.ndarray) -> None:
        self.tokens.write(ids.tobytes())
        self.meta["file"].extend(r.file for r in recs)
        self.meta["line"].extend(r.line for r in recs)
        self.meta["n_tokens"].extend(lengths.tolist())
        self.meta["meta"].extend(r.meta for r in recs)
        self.pending -= len(recs)

    def finish(self) -> None:
        self.tokens.close()
        self.quarantine.close()
        docs = pl.DataFrame(self.meta, schema=CHUNK_SCHEMA)
        docs.write_parquet(self.tmp / "docs.parquet", row_group_size=INDEX_ROWS)  # read back a row group at a time
        assert self.described is not None, "set when the chunk was opened"
        files, content = self.described.result()
        report = {
            "seen": self.seen,
            "bytes_in": self.bytes_in,
            "reasons": dict(self.reasons),
            "missing": dict(self.missing),
            "files": files,
            "content": content,
        }
        write_report(self.tmp, report)  # written last: the chunk is complete
        shutil.rmtree(self.final, ignore_errors=True)
        os.replace(self.tmp, self.final)


def write_report(folder: Path, report: dict[str, Any], known: dict[str, str] | None = None) -> None:
    """Write ``folder/report.json``: ``report`` plus the sha256 of the chunk's other files (which must be in
    ``folder`` already) and ``check``, the checksum of all of that (:func:`mixing.ingest.chunk_store.check_chunk`
    verifies both).

    ``known``: sha256 already recorded for some of the files, taken as they are, not hashed again: a file
    carried over from another chunk keeps the sum it was written with, so damage it took since is still caught
    when the chunk is checked, never blessed by a new sum."""
    known = known or {}
    report = {**report, "sha256": {f: known.get(f) or sha256_file(folder / f) for f in CHUNK_FILES}}
    body = json.dumps(report, sort_keys=True)
    (folder / REPORT).write_text(json.dumps({**report, "check": hashlib.sha256(body.encode()).hexdigest()}))


def quarantine_line(row: dict[str, Any]) -> str:
    """One line of ``quarantine.jsonl`` (no newline) for ``row`` (``file``, ``line``, ``reason``, ``detail``,
    ``sample``): UTF-8 JSON, or ASCII-escaped JSON when a file name that is not UTF-8 left a lone surrogate."""
    line = json.dumps(row, ensure_ascii=False)
    if not line.isascii() and has_surrogate(line):
        line = json.dumps(row)
    return line


def chunk_groups(files: pl.DataFrame, tokenizer: TextTokenizer, spec: SourceSpec) -> list[tuple[Group, str]]:
    """``files`` (an index frame) as chunks in order: each chunk's rows and its key.

    A boundary follows a file when its name's hash says so: with probability 1/:data:`_GROUP`, or
    ``size / CHUNK_BYTES`` (so chunks hold about that many bytes), and always around a file of
    :data:`CHUNK_BYTES` or more. Each boundary depends on one file's name (:func:`file_name`: its path below
    the source's fixed folder, so a moved or copied folder is cut as it was) and size only (``size`` 0 when
    the index has none), never on its contents or its neighbours. A file without a fingerprint gets a random
    key, so its chunk is never reused (nor equal between two calls).
    """
    groups: list[Group] = [[]]
    sizes = files["size"].to_list() if "size" in files.columns else [0] * len(files)
    for row, size in zip(files.iter_rows(named=True), sizes, strict=True):
        big = (size or 0) >= CHUNK_BYTES
        if big and groups[-1]:
            groups.append([])
        groups[-1].append(row)
        h = hashlib.sha1(file_name(row).encode()).digest()
        by_count = int.from_bytes(h[:4], "big") % _GROUP == 0
        by_bytes = int.from_bytes(h[4:12], "big") / 2**64 < (size or 0) / CHUNK_BYTES
        if big or by_count or by_bytes:
            groups.append([])
    return [(g, _key(g, tokenizer, spec)) for g in groups if g]


def _key(group: Group, tokenizer: TextTokenizer, spec: SourceSpec) -> str:
    h = hashlib.sha256(_spec_part(tokenizer, spec).encode())
    for row in group:
        fp = row.get("fingerprint") or os.urandom(8).hex()  # no fingerprint: never reuse
        h.update(f"|{row['path']}|{fp}".encode())
    return h.hexdigest()[:32]


def _spec_part(tokenizer: TextTokenizer, spec: SourceSpec) -> str:
    return f"{tokenizer.fingerprint}|{spec.render_fingerprint()}|r{READER_VERSION}|c{_CHUNK_VERSION}"


def describe_files(group: Group, env: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """The chunk's files as its report lists them: ``name``, ``path``, ``size`` and content ``digest`` each, in
    order; a row's ``digest`` when it has one already (hashed by whoever looked it up), else
    :func:`file_digest` (a local file is read: call it beside the tokenizing, not before; ``env`` as there)."""
    return [
        {
            "name": file_name(row),
            "path": row["path"],
            "size": row.get("size") or 0,
            "digest": row["digest"] if "digest" in row else file_digest(row, env),
        }
        for row in group
    ]


def content_key(files: list[dict[str, Any]], tokenizer: TextTokenizer, spec: SourceSpec) -> str | None:
    """The key of a chunk's documents by content: its files' names, sizes and digests (``files`` as
    :func:`describe_files` gives them), the tokenizer and the rendering; equal content keys mean equal
    documents save for the paths they name. None when a file's digest is unknown (never found by content)."""
    if any(f["digest"] is None for f in files):
        return None
    h = hashlib.sha256(f"{_spec_part(tokenizer, spec)}|content".encode())
    for f in files:
        h.update(f"|{f['name']}|{f['size']}|{f['digest']}".encode())
    return h.hexdigest()[:32]


def chunk_keys(files: pl.DataFrame, tokenizer: TextTokenizer, spec: SourceSpec) -> list[str]:
    """The chunk keys :func:`mixing.ingest.documents.tokenize_source` gives ``files`` (an index frame):
    equal keys, equal documents.

    A build folder whose ``chunks/`` holds every key of a source's current files holds that source's
    documents as a build would make them now (same files, tokenizer and rendering).
    """
    return [key for _group, key in chunk_groups(files, tokenizer, spec)]


def tokenize_chunks(
    spec: SourceSpec,
    todo: list[tuple[Group, str]],
    tokenizer: TextTokenizer,
    chunks_dir: Path,
    storage_options: dict[str, Any] | None,
    done_files: int,
    started: float,
    report: Callable[[int, int, int, int], None],
    env: Mapping[str, str] | None = None,
) -> None:
    """Tokenize every record of the ``todo`` chunks (rows, key) into ``chunks_dir/<key>``.

    Each file is read as its row lists it (:class:`mixing.ingest.sources.Listed`): one written since it was
    indexed raises :class:`mixing.ingest.sources.FileChangedError` and its chunk is not written. ``env``: the
    ``{env_NAME}`` values of the process that indexed the files (:func:`mixing.mixfile.envvars.shipped`), for
    a worker whose environment lacks them.

    One thread reads and parses (:func:`mixing.ingest.sources.read_ahead`, at most four 256 KB hand-overs
    queued), one runs the tokenizer on the next ~1 MB batch (it releases the GIL), and the caller's thread
    writes the previous batch; memory is bounded by those batches, not by the source. A chunk's files are
    hashed for its report (:func:`describe_files`) on another thread once its first file is being read, so the
    hashing reads what the page cache holds and overlaps the tokenizing.

    ``report(files done, chunks done, documents written, bytes of text read)`` is called about once a second from
    ``started`` (``time.perf_counter``), and once at the end; files done start at ``done_files`` (the files
    of reused chunks).
    """
    batch: list[tuple[_Chunk, Record]] = []
    batch_bytes = 0
    open_chunks: list[_Chunk] = []
    docs = text_bytes = finished = 0
    last = started

    # Two batches in flight at most: the tokenizer encodes batch k+1 on a worker thread (GIL released)
    # while this thread turns batch k's result into arrays and writes it.
    encoder = ThreadPoolExecutor(1, thread_name_prefix="weir-encode")
    hasher = ThreadPoolExecutor(1, thread_name_prefix="weir-digest")
    inflight: collections.deque[tuple[Future[Any], list[tuple[_Chunk, Record]]]] = collections.deque()

    def write(handle: Any, done: list[tuple[_Chunk, Record]]) -> None:
        nonlocal docs
        ids, lengths = tokenizer.encode_finish(handle)
        ends = np.cumsum(lengths)
        i = 0
        while i < len(done):  # hand each chunk its run of consecutive records in one write
            j = i
            while j < len(done) and done[j][0] is done[i][0]:
                j += 1
            lo = int(ends[i - 1]) if i else 0
            done[i][0].add([r for _c, r in done[i:j]], ids[lo : int(ends[j - 1])], lengths[i:j])
            i = j
        docs += len(done)

    def flush(final: bool = False) -> None:
        nonlocal batch, batch_bytes, finished
        if batch:
            inflight.append((encoder.submit(tokenizer.encode_start, [r.text or "" for _c, r in batch]), batch))
            batch, batch_bytes = [], 0
        while len(inflight) > (0 if final else 1):
            fut, done = inflight.popleft()
            write(fut.result(), done)
        for c in [c for c in open_chunks if c.read_all and not c.pending]:
            c.finish()
            open_chunks.remove(c)
            finished += 1

    chunks: dict[int, _Chunk] = {}
    files_left = [len(group) for group, _key in todo]
    try:
        paths = [[_path_or_skipped(row) for row in group] for group, _key in todo]
        for gi, rec in read_ahead(paths, spec, storage_options, env):
            chunk = chunks.get(gi)
            if chunk is None:
                chunk = chunks[gi] = _Chunk(chunks_dir / todo[gi][1])
                chunk.described = hasher.submit(_described, todo[gi][0], tokenizer, spec, env)
                open_chunks.append(chunk)
            if rec is None:  # end of a file
                done_files += 1
                files_left[gi] -= 1
                chunk.read_all = files_left[gi] == 0
                if time.perf_counter() - last >= 1.0:
                    last = time.perf_counter()
                    report(done_files, finished, docs, text_bytes)
                continue
            if rec.text is None:
                chunk.bad(rec)
                continue
            size = len(rec.text.encode("utf-8", "surrogatepass"))
            chunk.seen += 1
            chunk.bytes_in += size
            chunk.pending += 1
            text_bytes += size
            batch.append((chunk, rec))
            batch_bytes += size
            if batch_bytes >= _BATCH_BYTES:
                flush()
        flush(final=True)
    finally:
        encoder.shutdown()
        hasher.shutdown(cancel_futures=True)
    assert not open_chunks, "every chunk is complete once every file was read and encoded"
    if todo:
        report(done_files, finished, docs, text_bytes)


def _described(
    group: Group, tokenizer: TextTokenizer, spec: SourceSpec, env: Mapping[str, str] | None = None
) -> Described:
    files = describe_files(group, env)
    return files, content_key(files, tokenizer, spec)


def _path_or_skipped(row: dict[str, Any]) -> Listed | Record:
    skipped = row.get("skipped")
    return skipped_record(row["path"], skipped) if skipped else Listed.of(row)
