"""Tokenized documents of one source: metadata as parquet, token ids as one flat binary file.

Per source folder: ``docs.parquet`` (``doc_id`` int64 0..n-1 in file/record order, ``source``, ``file``,
``line``, ``n_tokens`` int64, ``offset`` int64 into the token file, ``meta`` JSON string or null,
``tokenizer``: the fingerprint of the tokenizer that made them), ``tokens.bin`` (little-endian uint32 token
ids, documents back to back, BOS/EOS as the mix says) and ``quarantine.jsonl`` (one line per malformed
record: file, line, reason, detail, sample). All three are written to temporary names and renamed.

Incremental: the source's files are tokenized in chunks (:mod:`mixing.ingest.chunks`) kept under
``chunks/<key>/``; a chunk whose key is already there is reused, so a rebuild after one file changed
re-tokenizes only that file's chunk. The final files are the chunks concatenated in order, so the result
equals a clean build byte for byte.

Integrity: every chunk is verified against its checksums while it is concatenated; a damaged one (a flipped
bit in a reused chunk, a truncated file) is deleted, tokenized again, and named in
:attr:`TokenizeReport.warnings`, so no damaged byte reaches the outputs. Paths the index skipped (dangling
symlinks, symlink loops, directories) are quarantined with their reason, so ``docs_seen`` accounts for every
matched path.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from mixing.errors import WeirError
from mixing.format.layout import atomic_path
from mixing.ingest.chunks import CHUNK_SCHEMA, ChunkDamaged, chunk_groups, read_chunk, tokenize_chunks
from mixing.ingest.tokenizer import TextTokenizer
from mixing.spec.mixfile import SourceSpec

__all__ = [
    "DocumentSet",
    "DocumentsError",
    "TokenizeProgress",
    "TokenizeReport",
    "open_documents",
    "tokenize_source",
]

_QUARANTINE_SAMPLE = 20  # bad records per reason listed in the report (all are in quarantine.jsonl)
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
    groups = chunk_groups(files, tokenizer, spec)
    keys = [k for _g, k in groups]
    todo = [(g, k) for g, k in groups if not (chunks_dir / k / "report.json").exists()]
    tokenized = {k for _g, k in todo}
    started = time.perf_counter()
    warnings: list[str] = []
    damaged: list[str] = []

    def warn(msg: str) -> None:
        warnings.append(msg)
        LOG.warning(msg)
        progress(msg)

    def show_progress(files_done: int, docs: int, text_bytes: int) -> None:
        mb = text_bytes / 1e6
        ev = TokenizeProgress(name, files_done, len(files), docs, mb, mb / max(time.perf_counter() - started, 1e-9))
        progress(str(ev))
        PROGRESS_LOG.info(str(ev), extra={"progress": ev})

    for attempt in range(2):
        reused_files = len(files) - sum(len(g) for g, _k in todo)
        tokenize_chunks(spec, todo, tokenizer, chunks_dir, storage_options, reused_files, started, show_progress)
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
            todo = [(g, k) for g, k in groups if k in e.chunks]
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
                rep, df, q_raw = read_chunk(c, tok_f)
            except ChunkDamaged as e:
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
    empty = pl.DataFrame(schema={**CHUNK_SCHEMA, "offset": pl.Int64})
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
