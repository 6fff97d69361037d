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

Integrity: a chunk's ``report.json`` (written last) holds the sha256 of its three files and a checksum of
itself. Every chunk is verified while it is concatenated; a damaged one (a flipped bit in a reused
chunk, a truncated file) is deleted, tokenized again, and named in :attr:`TokenizeReport.warnings`, so
no damaged byte reaches the outputs. Paths the index skipped (dangling symlinks, symlink loops,
directories) are quarantined with their reason, so ``docs_seen`` accounts for every matched path.

Throughput and memory: one thread reads and parses (:func:`mixing.ingest.sources.read_ahead`, at most four
256 KB hand-overs queued), one runs the tokenizer on the next ~1 MB batch (it releases the GIL), and the
caller's thread writes the previous batch; memory is bounded by those batches, not by the source.
"""

from __future__ import annotations

import collections
import hashlib
import io
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

from mixing.errors import WeirError
from mixing.format.layout import atomic_path
from mixing.ingest.formats import READER_VERSION
from mixing.ingest.records import Record, has_surrogate
from mixing.ingest.sources import read_ahead, skipped_record
from mixing.ingest.tokenizer import TextTokenizer
from mixing.spec.mixfile import SourceSpec

__all__ = [
    "DocumentSet",
    "DocumentsError",
    "TokenizeProgress",
    "TokenizeReport",
    "chunk_keys",
    "open_documents",
    "tokenize_source",
]

_BATCH_BYTES = 1 << 20  # text per encode call: large enough to keep every tokenizer thread busy
_GROUP = 32  # files per chunk, on average
_QUARANTINE_SAMPLE = 20  # bad records per reason listed in the report (all are in quarantine.jsonl)
_CHUNK_FILES = ("tokens.bin", "docs.parquet", "quarantine.jsonl")  # checksummed in report.json
_CHUNK_VERSION = 2  # 2: chunks carry checksums
PROGRESS_LOG = logging.getLogger("weir.progress")  # the CLI shows these events as a progress bar
LOG = logging.getLogger("weir.documents")


class DocumentsError(WeirError, RuntimeError):
    """A source none of whose records became a document, or a chunk that stays damaged when rewritten."""


@dataclass(frozen=True)
class TokenizeReport:
    """What tokenizing one source saw: ``docs_seen == docs_kept + docs_quarantined``.

    ``chunks_reused`` of ``chunks`` came from a previous build. ``quarantine_sample`` holds up to
    :data:`_QUARANTINE_SAMPLE` ``{file, line, reason}`` per reason; ``tokenizer`` is its fingerprint.
    ``missing_fields`` counts records per field they lack (``"template field 'q'"``); ``chunks_damaged``
    names each reused chunk that failed its checksum and was tokenized again; ``warnings`` are one-line
    messages about both.
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
    missing_fields: dict[str, int] = field(default_factory=dict)
    chunks_damaged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


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
        self.quarantine: IO[str] = (self.tmp / "quarantine.jsonl").open("w", encoding="utf-8")
        self.missing: Counter[str] = Counter()
        self.meta: dict[str, list[Any]] = {k: [] for k in _CHUNK_SCHEMA}
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
        line = json.dumps(row, ensure_ascii=False)
        if not line.isascii() and has_surrogate(line):  # a file name that is not UTF-8: escaped instead
            line = json.dumps(row)
        self.quarantine.write(line + "\n")

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
        report = {
            "seen": self.seen,
            "bytes_in": self.bytes_in,
            "reasons": dict(self.reasons),
            "missing": dict(self.missing),
            "sha256": {f: _sha256_file(self.tmp / f) for f in _CHUNK_FILES},
        }
        body = json.dumps(report, sort_keys=True)
        text = json.dumps({**report, "check": hashlib.sha256(body.encode()).hexdigest()})
        (self.tmp / "report.json").write_text(text)  # written last: the chunk is complete
        shutil.rmtree(self.final, ignore_errors=True)
        os.replace(self.tmp, self.final)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _chunk_report(chunk: Path) -> dict[str, Any]:
    """The chunk's report.json, checked against its own checksum; raises ``_Damaged``."""
    try:
        rep = json.loads((chunk / "report.json").read_text())
        check = rep.pop("check")
        body = json.dumps(rep, sort_keys=True)
    except (OSError, ValueError, KeyError, AttributeError) as e:
        raise _Damaged(f"report.json unreadable: {type(e).__name__}") from None
    if hashlib.sha256(body.encode()).hexdigest() != check or not isinstance(rep.get("sha256"), dict):
        raise _Damaged("report.json checksum mismatch")
    return rep  # type: ignore[no-any-return]


class _Damaged(Exception):
    """A chunk whose files do not match the checksums its report.json recorded."""


def _groups(files: pl.DataFrame) -> list[list[dict[str, Any]]]:
    """Consecutive files cut where a path's hash says so: boundaries never depend on file contents."""
    groups: list[list[dict[str, Any]]] = [[]]
    for row in files.iter_rows(named=True):
        groups[-1].append(row)
        if int(hashlib.sha1(row["path"].encode()).hexdigest()[:8], 16) % _GROUP == 0:
            groups.append([])
    return [g for g in groups if g]


def _key(group: list[dict[str, Any]], tokenizer: TextTokenizer, spec: SourceSpec) -> str:
    fps = f"{tokenizer.fingerprint}|{spec.render_fingerprint()}|r{READER_VERSION}|c{_CHUNK_VERSION}"
    h = hashlib.sha256(fps.encode())
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
    require_documents: bool = False,
) -> TokenizeReport:
    """Tokenize every record of ``files`` (an index frame with ``path``, ``fingerprint`` and optionally
    ``skipped``; or paths) in order.

    Malformed records (and skipped paths) go to the quarantine file and are counted; chunks already in
    ``out_dir/chunks`` with the same key are reused once their checksums match (see the module docstring).
    ``progress`` gets a line about once a second, and each warning. With ``require_documents``, a source
    that read records but kept none raises :class:`DocumentsError` naming why (after writing its files).
    """
    if not isinstance(files, pl.DataFrame):
        files = pl.DataFrame({"path": list(files)}, schema={"path": pl.String})
    out_dir.mkdir(parents=True, exist_ok=True)
    chunks_dir = out_dir / "chunks"
    groups = _groups(files)
    keys = [_key(g, tokenizer, spec) for g in groups]
    todo = [(g, k) for g, k in zip(groups, keys, strict=True) if not (chunks_dir / k / "report.json").exists()]
    tokenized = {k for _g, k in todo}
    started = time.perf_counter()
    warnings: list[str] = []
    damaged: list[str] = []

    def warn(msg: str) -> None:
        warnings.append(msg)
        LOG.warning(msg)
        progress(msg)

    for attempt in range(2):
        reused_files = len(files) - sum(len(g) for g, _k in todo)
        _tokenize_chunks(
            name, spec, todo, tokenizer, chunks_dir, (reused_files, len(files)), progress, storage_options, started
        )
        try:
            report = _assemble(name, [chunks_dir / k for k in keys], tokenizer.fingerprint, out_dir)
            break
        except _DamagedChunks as e:
            if attempt:  # a chunk just written does not read back: the disk, not the data
                raise DocumentsError(
                    f"source {name!r}: chunk(s) {', '.join(e.chunks)} damaged again right after being tokenized "
                    f"({'; '.join(e.chunks.values())}); check the disk under {chunks_dir}"
                ) from None
            for k, why in e.chunks.items():
                damaged.append(k)
                warn(f"chunk {k} of source {name!r} was damaged ({why}), re-tokenized")
                shutil.rmtree(chunks_dir / k, ignore_errors=True)  # unlinks a hard link, never the old build's
            todo = [(g, k) for g, k in zip(groups, keys, strict=True) if k in e.chunks]
            tokenized |= set(e.chunks)
    for stale in set(os.listdir(chunks_dir)) - set(keys) if chunks_dir.exists() else ():
        shutil.rmtree(chunks_dir / stale, ignore_errors=True)
    missing: dict[str, int] = report.pop("missing_fields")
    for what, n in sorted(missing.items(), key=lambda kv: -kv[1]):
        warn(f"source {name!r}: {n} of {report['docs_seen']} records lack {what}")
    result = TokenizeReport(
        **report,
        chunks=len(keys),
        chunks_reused=len(set(keys) - tokenized),
        tokenizer=tokenizer.fingerprint,
        seconds=time.perf_counter() - started,
        missing_fields=missing,
        chunks_damaged=damaged,
        warnings=warnings,
    )
    if require_documents and result.docs_seen and not result.docs_kept:
        raise DocumentsError(_no_documents(name, result))
    return result


def _no_documents(name: str, r: TokenizeReport) -> str:
    """One line: why no record of source ``name`` became a document."""
    first = r.quarantine_sample[0] if r.quarantine_sample else None
    where = f" (first: {first['file']}:{first['line']})" if first else ""
    if r.missing_fields:
        what, n = max(r.missing_fields.items(), key=lambda kv: kv[1])
        return f"source {name!r} has no documents: {n} of {r.docs_seen} records lack {what}{where}"
    reasons = ", ".join(f"{n} {reason}" for reason, n in Counter(r.quarantine_reasons).most_common(3))
    return f"source {name!r} has no documents: all {r.docs_seen} records were quarantined ({reasons}){where}"


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
        paths = [[_path_or_skipped(row) for row in group] for group, _key in todo]
        for gi, rec in read_ahead(paths, spec, storage_options):
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


def _path_or_skipped(row: dict[str, Any]) -> str | Record:
    skipped = row.get("skipped")
    return skipped_record(row["path"], skipped) if skipped else row["path"]


class _DamagedChunks(Exception):
    """Chunks (key → what is wrong) that failed their checksums while being assembled."""

    def __init__(self, chunks: dict[str, str]) -> None:
        super().__init__(", ".join(chunks))
        self.chunks = chunks


def _assemble(name: str, chunks: list[Path], tokenizer_fp: str, out_dir: Path) -> dict[str, Any]:
    """Concatenate the chunks into the source's three files, verifying each chunk's checksums; return the
    summed counts. Raises :class:`_DamagedChunks` (writing nothing) naming every chunk that fails them."""
    frames: list[pl.DataFrame] = []
    reasons: Counter[str] = Counter()
    missing: Counter[str] = Counter()
    sample: list[dict[str, Any]] = []
    per_reason: Counter[str] = Counter()
    damaged: dict[str, str] = {}
    seen = bytes_in = n_tokens = quarantined = 0
    with (
        atomic_path(out_dir / "tokens.bin") as tok_tmp,
        atomic_path(out_dir / "quarantine.jsonl") as q_tmp,
        tok_tmp.open("wb") as tok_f,
        q_tmp.open("wb") as q_f,
    ):
        for c in chunks:
            try:
                rep, df, q_raw = _read_chunk(c, tok_f)
            except _Damaged as e:
                damaged[c.name] = str(e)
                continue
            if damaged:
                continue  # the outputs are thrown away: only look for further damage
            seen += rep["seen"]
            bytes_in += rep["bytes_in"]
            reasons.update(rep["reasons"])
            missing.update(rep["missing"])
            offsets = n_tokens + df["n_tokens"].cum_sum() - df["n_tokens"]
            frames.append(df.with_columns(offset=offsets))
            n_tokens += int(df["n_tokens"].sum())
            q_f.write(q_raw)
            for line in q_raw.split(b"\n"):  # not splitlines: U+2028 and friends may be inside a string
                if not line:
                    continue
                quarantined += 1
                row = json.loads(line)
                if per_reason[row["reason"]] < _QUARANTINE_SAMPLE:
                    per_reason[row["reason"]] += 1
                    sample.append({k: row[k] for k in ("file", "line", "reason")})
        if damaged:
            raise _DamagedChunks(damaged)
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
        "missing_fields": dict(missing),
    }


def _read_chunk(c: Path, tok_f: IO[bytes]) -> tuple[dict[str, Any], pl.DataFrame, bytes]:
    """Copy chunk ``c``'s tokens to ``tok_f`` and read its report, documents and quarantine lines, checking
    each file against the report's sha256 (hashing the tokens as they are copied); raises ``_Damaged``."""
    rep = _chunk_report(c)
    sums = rep["sha256"]
    try:
        h = hashlib.sha256()
        with (c / "tokens.bin").open("rb") as tokens:
            while block := tokens.read(1 << 22):
                h.update(block)
                tok_f.write(block)
        if h.hexdigest() != sums.get("tokens.bin"):
            raise _Damaged("tokens.bin sha256 mismatch")
        raw = {name: (c / name).read_bytes() for name in _CHUNK_FILES[1:]}
    except OSError as e:
        raise _Damaged(f"{type(e).__name__}: {e.strerror}") from None
    for name, data in raw.items():
        if hashlib.sha256(data).hexdigest() != sums.get(name):
            raise _Damaged(f"{name} sha256 mismatch")
    return rep, pl.read_parquet(io.BytesIO(raw["docs.parquet"])), raw["quarantine.jsonl"]


def chunk_keys(files: pl.DataFrame, tokenizer: TextTokenizer, spec: SourceSpec) -> list[str]:
    """The chunk keys :func:`tokenize_source` gives ``files`` (an index frame): equal keys, equal documents.

    A build folder whose ``chunks/`` holds every key of a source's current files holds that source's
    documents as a build would make them now (same files, tokenizer and rendering).
    """
    return [_key(g, tokenizer, spec) for g in _groups(files)]
