"""Tokenized documents of one source: metadata as parquet, token ids as one flat binary file.

Per source folder: ``docs.parquet`` (``doc_id`` int64 0..n-1 in file/record order, ``source``, ``file``,
``line``, ``n_tokens`` int64, ``offset`` int64 into the token file, ``meta`` JSON string or null,
``tokenizer``: the fingerprint of the tokenizer that made them), ``tokens.bin`` (little-endian uint32 token
ids, documents back to back, BOS/EOS as the mix says) and ``quarantine.jsonl`` (one line per malformed
record: file, line, reason, detail, sample). All three are written to temporary names and renamed.

Incremental: the source's files are cut into chunks at stable, path-determined boundaries (about
:data:`_GROUP` files each; changing a file never moves a boundary). A chunk is tokenized into
``chunks/<key>/`` where ``key`` hashes its files' paths and fingerprints, the tokenizer's fingerprint and the
source's rendering spec; a chunk whose key is already there is reused, so a rebuild after one file changed
re-tokenizes only that file's chunk. The final files are the chunks concatenated in order, so the result
equals a clean build byte for byte.

Throughput and memory: one thread reads and parses (:func:`mixing.sources.read_ahead`, at most four
256 KB hand-overs queued), one runs the tokenizer on the next ~1 MB batch (it releases the GIL), and the
caller's thread writes the previous batch; memory is bounded by those batches, not by the source.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import polars as pl

from mixing.formats import READER_VERSION
from mixing.layout import atomic_path
from mixing.mixfile import SourceSpec
from mixing.records import Record
from mixing.sources import read_ahead
from mixing.tokenizer import TextTokenizer

__all__ = ["DocumentSet", "TokenizeProgress", "TokenizeReport", "open_documents", "tokenize_source"]

_BATCH_BYTES = 1 << 20  # text per encode call: large enough to keep every tokenizer thread busy
_GROUP = 32  # files per chunk, on average
_QUARANTINE_SAMPLE = 20  # bad records per reason listed in the report (all are in quarantine.jsonl)
PROGRESS_LOG = logging.getLogger("weir.progress")  # the CLI shows these events as a progress bar


@dataclass(frozen=True)
class TokenizeReport:
    """What tokenizing one source saw: ``docs_seen == docs_kept + docs_quarantined``.

    ``chunks_reused`` of ``chunks`` came from a previous build. ``quarantine_sample`` holds up to
    :data:`_QUARANTINE_SAMPLE` ``{file, line, reason}`` per reason; ``tokenizer`` is its fingerprint.
    """

    docs_seen: int
    docs_kept: int
    docs_quarantined: int
    tokens: int
    bytes_in: int
    quarantine_reasons: dict[str, int] = field(default_factory=dict)
    quarantine_sample: list[dict[str, Any]] = field(default_factory=list)
    chunks: int = 0
    chunks_reused: int = 0
    tokenizer: str = ""
    seconds: float = 0.0


@dataclass(frozen=True)
class TokenizeProgress:
    """One progress event: files done of ``files``, documents kept, MB of text read, rate in MB/s."""

    source: str
    files_done: int
    files: int
    documents: int
    mb: float
    mb_per_s: float

    def __str__(self) -> str:
        return (
            f"{self.source}: {self.files_done}/{self.files} files, {self.documents:,} documents, "
            f"{self.mb:.1f} MB at {self.mb_per_s:.1f} MB/s"
        )


@dataclass(frozen=True)
class DocumentSet:
    """A tokenized source opened for reading; ``tokens`` is a read-only uint32 memory map."""

    docs: pl.DataFrame
    tokens: np.ndarray

    def document(self, doc_id: int) -> np.ndarray:
        row = self.docs.row(doc_id, named=True)
        return self.tokens[row["offset"] : row["offset"] + row["n_tokens"]]


def open_documents(source_dir: Path) -> DocumentSet:
    docs = pl.read_parquet(source_dir / "docs.parquet")
    path = source_dir / "tokens.bin"
    tokens = np.memmap(path, dtype="<u4", mode="r") if path.stat().st_size else np.zeros(0, "<u4")
    return DocumentSet(docs, tokens)


_CHUNK_SCHEMA = {"file": pl.String, "line": pl.Int64, "n_tokens": pl.Int64, "meta": pl.String}


class _Chunk:
    """One chunk being tokenized into a temporary folder, renamed to ``chunks/<key>`` when complete."""

    def __init__(self, final: Path) -> None:
        self.final = final
        self.tmp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        self.tokens: IO[bytes] = (self.tmp / "tokens.bin").open("wb")
        self.quarantine: IO[str] = (self.tmp / "quarantine.jsonl").open("w")
        self.meta: dict[str, list[Any]] = {k: [] for k in _CHUNK_SCHEMA}
        self.pending = 0  # records read but not yet encoded
        self.read_all = False
        self.seen = 0
        self.bytes_in = 0
        self.reasons: Counter[str] = Counter()

    def bad(self, rec: Record) -> None:
        self.seen += 1
        self.reasons[rec.reason or "?"] += 1
        row = {"file": rec.file, "line": rec.line, "reason": rec.reason, "detail": rec.error, "sample": rec.sample}
        self.quarantine.write(json.dumps(row, ensure_ascii=False) + "\n")

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
        pl.DataFrame(self.meta, schema=_CHUNK_SCHEMA).write_parquet(self.tmp / "docs.parquet")
        report = {"seen": self.seen, "bytes_in": self.bytes_in, "reasons": dict(self.reasons)}
        (self.tmp / "report.json").write_text(json.dumps(report))  # written last: the chunk is complete
        shutil.rmtree(self.final, ignore_errors=True)
        os.replace(self.tmp, self.final)


def _groups(files: pl.DataFrame) -> list[list[dict[str, Any]]]:
    """Consecutive files cut where a path's hash says so: boundaries never depend on file contents."""
    groups: list[list[dict[str, Any]]] = [[]]
    for row in files.iter_rows(named=True):
        groups[-1].append(row)
        if int(hashlib.sha1(row["path"].encode()).hexdigest()[:8], 16) % _GROUP == 0:
            groups.append([])
    return [g for g in groups if g]


def _key(group: list[dict[str, Any]], tokenizer: TextTokenizer, spec: SourceSpec) -> str:
    h = hashlib.sha256(f"{tokenizer.fingerprint}|{spec.render_fingerprint()}|r{READER_VERSION}".encode())
    for row in group:
        fp = row.get("fingerprint") or os.urandom(8).hex()  # no fingerprint: never reuse
        h.update(f"|{row['path']}|{fp}".encode())
    return h.hexdigest()[:32]


def tokenize_source(
    name: str,
    spec: SourceSpec,
    files: pl.DataFrame | Iterable[str],
    tokenizer: TextTokenizer,
    out_dir: Path,
    progress: Callable[[str], None] = lambda _msg: None,
    storage_options: dict[str, Any] | None = None,
) -> TokenizeReport:
    """Tokenize every record of ``files`` (an index frame with ``path``, ``fingerprint``; or paths) in order.

    Malformed records go to the quarantine file and are counted; chunks already in ``out_dir/chunks``
    with the same key are reused (see the module docstring). ``progress`` gets a line about once a second.
    """
    if not isinstance(files, pl.DataFrame):
        files = pl.DataFrame({"path": list(files)}, schema={"path": pl.String})
    out_dir.mkdir(parents=True, exist_ok=True)
    chunks_dir = out_dir / "chunks"
    groups = _groups(files)
    keys = [_key(g, tokenizer, spec) for g in groups]
    todo = [(g, k) for g, k in zip(groups, keys, strict=True) if not (chunks_dir / k / "report.json").exists()]
    started = time.perf_counter()
    reused_files = len(files) - sum(len(g) for g, _k in todo)
    _tokenize_chunks(
        name, spec, todo, tokenizer, chunks_dir, (reused_files, len(files)), progress, storage_options, started
    )
    report = _assemble(name, [chunks_dir / k for k in keys], tokenizer.fingerprint, out_dir)
    for stale in set(os.listdir(chunks_dir)) - set(keys) if chunks_dir.exists() else ():
        shutil.rmtree(chunks_dir / stale, ignore_errors=True)
    return TokenizeReport(
        **report,
        chunks=len(keys),
        chunks_reused=len(keys) - len(todo),
        tokenizer=tokenizer.fingerprint,
        seconds=time.perf_counter() - started,
    )


def _tokenize_chunks(
    name: str,
    spec: SourceSpec,
    todo: list[tuple[list[dict[str, Any]], str]],
    tokenizer: TextTokenizer,
    chunks_dir: Path,
    file_counts: tuple[int, int],
    progress: Callable[[str], None],
    storage_options: dict[str, Any] | None,
    started: float,
) -> None:
    batch: list[tuple[_Chunk, Record]] = []
    batch_bytes = 0
    open_chunks: list[_Chunk] = []
    done_files, n_files = file_counts  # files of reused chunks count as done from the start
    docs = text_bytes = 0
    last = started

    # Two batches in flight at most: the tokenizer encodes batch k+1 on a worker thread (GIL released)
    # while this thread turns batch k's result into arrays and writes it.
    encoder = ThreadPoolExecutor(1, thread_name_prefix="weir-encode")
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
        nonlocal batch, batch_bytes
        if batch:
            inflight.append((encoder.submit(tokenizer.encode_start, [r.text or "" for _c, r in batch]), batch))
            batch, batch_bytes = [], 0
        while len(inflight) > (0 if final else 1):
            fut, done = inflight.popleft()
            write(fut.result(), done)
        for c in [c for c in open_chunks if c.read_all and not c.pending]:
            c.finish()
            open_chunks.remove(c)

    def report() -> None:
        now = time.perf_counter()
        mb = text_bytes / 1e6
        ev = TokenizeProgress(name, done_files, n_files, docs, mb, mb / max(now - started, 1e-9))
        progress(str(ev))
        PROGRESS_LOG.info(str(ev), extra={"progress": ev})

    chunks: dict[int, _Chunk] = {}
    files_left = [len(group) for group, _key in todo]
    try:
        for gi, rec in read_ahead([[row["path"] for row in group] for group, _key in todo], spec, storage_options):
            chunk = chunks.get(gi)
            if chunk is None:
                chunk = chunks[gi] = _Chunk(chunks_dir / todo[gi][1])
                open_chunks.append(chunk)
            if rec is None:  # end of a file
                done_files += 1
                files_left[gi] -= 1
                chunk.read_all = files_left[gi] == 0
                if time.perf_counter() - last >= 1.0:
                    last = time.perf_counter()
                    report()
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
    assert not open_chunks, "every chunk is complete once every file was read and encoded"
    if todo:
        report()


def _assemble(name: str, chunks: list[Path], tokenizer_fp: str, out_dir: Path) -> dict[str, Any]:
    """Concatenate the chunks into the source's three files; return the summed counts."""
    frames: list[pl.DataFrame] = []
    reasons: Counter[str] = Counter()
    sample: list[dict[str, Any]] = []
    per_reason: Counter[str] = Counter()
    seen = bytes_in = n_tokens = quarantined = 0
    with (
        atomic_path(out_dir / "tokens.bin") as tok_tmp,
        atomic_path(out_dir / "quarantine.jsonl") as q_tmp,
        tok_tmp.open("wb") as tok_f,
        q_tmp.open("w") as q_f,
    ):
        for c in chunks:
            rep = json.loads((c / "report.json").read_text())
            seen += rep["seen"]
            bytes_in += rep["bytes_in"]
            reasons.update(rep["reasons"])
            with (c / "tokens.bin").open("rb") as f:
                shutil.copyfileobj(f, tok_f, 1 << 22)
            df = pl.read_parquet(c / "docs.parquet")
            offsets = n_tokens + df["n_tokens"].cum_sum() - df["n_tokens"]
            frames.append(df.with_columns(offset=offsets))
            n_tokens += int(df["n_tokens"].sum())
            if rep["reasons"]:
                for line in (c / "quarantine.jsonl").open():
                    q_f.write(line)
                    quarantined += 1
                    row = json.loads(line)
                    if per_reason[row["reason"]] < _QUARANTINE_SAMPLE:
                        per_reason[row["reason"]] += 1
                        sample.append({k: row[k] for k in ("file", "line", "reason")})
    empty = pl.DataFrame(schema={**_CHUNK_SCHEMA, "offset": pl.Int64})
    docs = pl.concat(frames) if frames else empty
    kept = len(docs)
    docs = docs.select(
        pl.int_range(kept, dtype=pl.Int64).alias("doc_id"),
        pl.lit(name, pl.String).alias("source"),
        "file",
        "line",
        "n_tokens",
        pl.col("offset").cast(pl.Int64),
        "meta",
        pl.lit(tokenizer_fp, pl.String).alias("tokenizer"),
    )
    with atomic_path(out_dir / "docs.parquet") as tmp:
        docs.write_parquet(tmp)
    return {
        "docs_seen": seen,
        "docs_kept": kept,
        "docs_quarantined": quarantined,  # counted from the quarantine lines, so the identity is a check
        "tokens": n_tokens,
        "bytes_in": bytes_in,
        "quarantine_reasons": dict(reasons),
        "quarantine_sample": sample,
    }
