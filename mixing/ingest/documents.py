"""Tokenized documents of one source: a document index over token chunks.

A source's tokens live in chunks (:mod:`mixing.ingest.chunks`) under ``<source>/chunks/<key>/`` in the
build root, written by whichever engine tokenized them (:mod:`mixing.engine`): a chunk is never copied
again. The source's folder in the local working folder gets ``docs.parquet``, the document index
(:data:`mixing.ingest.doc_index.INDEX_SCHEMA`: a document's file, line, length, chunk and offset in that
chunk's ``tokens.bin``), and ``quarantine.jsonl`` (one line per malformed record: file, line, reason, detail,
sample), both written from the chunks one at a time (:func:`mixing.ingest.doc_index.write_index`).
:func:`open_documents` reads a document's tokens through the index, from a local build or any fsspec root.

Incremental: a chunk whose key is already in the root is reused (never submitted again), so a rebuild after
one file changed tokenizes only that file's chunk; the index equals a clean build's. A chunk whose files
moved (the mix and its data moved or copied elsewhere, the data reached through a link) has another key, yet
its documents are found by their content under the old one and renamed to it, naming the files where they
are now (:func:`mixing.ingest.relocation.relocate_chunks`): nothing is tokenized again unless a file's
contents changed.

Integrity: before the index is written, every reused chunk's files are checked against the checksums its
``report.json`` recorded (on a distributed engine by its workers, in parallel); a damaged chunk is removed,
tokenized again and named in :attr:`TokenizeReport.warnings`, so no damaged byte reaches the index. A chunk
tokenized by this build was hashed by its writer as it wrote it. Paths the index skipped (dangling
symlinks, symlink loops, directories) are quarantined with their reason, so ``docs_seen`` accounts for every
matched path.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from contract.errors import WeirError
from contract.store import Store
from mixing.engine import LOCAL, Engine, LocalEngine
from mixing.ingest.chunk_store import (
    ChunkJob,
    ChunkTokens,
    ahead_since,
    is_ahead,
    present_keys,
    submit_ahead,
    tokenize_missing,
    verify_chunks,
)
from mixing.ingest.chunks import Group, chunk_groups
from mixing.ingest.doc_index import ChunksDamaged, write_index
from mixing.ingest.relocation import relocate_chunks
from mixing.ingest.tokenizer import TextTokenizer
from mixing.mixfile import envvars
from mixing.mixfile.mix import SourceSpec

__all__ = [
    "AheadWork",
    "DocumentSet",
    "DocumentsError",
    "TokenizeProgress",
    "TokenizeReport",
    "open_documents",
    "tokenize_ahead",
    "tokenize_source",
]

PROGRESS_LOG = logging.getLogger("weir.progress")  # the CLI shows these events as a progress bar
LOG = logging.getLogger("weir.documents")


class DocumentsError(WeirError, RuntimeError):
    """A source none of whose records became a document, or a chunk that stays damaged when rewritten."""


@dataclass(frozen=True)
class TokenizeReport:
    """What tokenizing one source saw: ``docs_seen == docs_kept + docs_quarantined``.

    ``chunks_reused`` of ``chunks`` came from a previous build, ``chunks_relocated`` of those found by content
    under the key their files had at another place (by this call). ``quarantine_sample`` holds up to
    20 ``{file, line, reason}`` per reason; ``tokenizer`` is its fingerprint.
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
    chunks_relocated: int = 0
    tokenizer: str = ""
    seconds: float = 0.0
    missing_fields: dict[str, int] = field(default_factory=dict)
    chunks_damaged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    engine: str = "local"
    workers: int = 1
    chunk_records: tuple[dict[str, Any], ...] = ()  # {name, bytes, sha256} of each chunk's report.json


@dataclass(frozen=True)
class TokenizeProgress:
    """One progress event: files and chunks done, documents kept, MB of text read, rate in MB/s (over every
    worker of the engine)."""

    source: str
    files_done: int
    files: int
    documents: int
    mb: float
    mb_per_s: float
    chunks_done: int = 0
    chunks: int = 0

    def __str__(self) -> str:
        return (
            f"{self.source}: {self.files_done}/{self.files} files, {self.documents:,} documents, "
            f"{self.chunks_done}/{self.chunks} chunks, {self.mb:.1f} MB at {self.mb_per_s:.1f} MB/s"
        )


@dataclass(frozen=True)
class DocumentSet:
    """A tokenized source opened for reading: its index ``docs`` and its chunks' ``tokens``."""

    docs: pl.DataFrame
    tokens: ChunkTokens

    def document(self, doc_id: int) -> np.ndarray:
        """The tokens (uint32) of document ``doc_id``."""
        row = self.docs.row(doc_id, named=True)
        return self.tokens.ranges(row["chunk"], np.array([row["offset"]]), np.array([row["n_tokens"]]))[0]


def open_documents(source_dir: Path, chunks: Store | None = None) -> DocumentSet:
    """The documents of the source whose index is in ``source_dir`` (local), tokens in ``chunks`` (default:
    ``source_dir/chunks``)."""
    return DocumentSet(
        pl.read_parquet(source_dir / "docs.parquet"), ChunkTokens(chunks or Store(source_dir / "chunks"))
    )


def tokenize_source(
    name: str,
    spec: SourceSpec,
    files: pl.DataFrame | Iterable[str],
    tokenizer: TextTokenizer,
    out_dir: Path,
    progress: Callable[[str], None] = lambda _msg: None,
    storage_options: dict[str, Any] | None = None,
    require_documents: bool = False,
    *,
    chunks: Store | None = None,
    engine: Engine = LOCAL,
) -> TokenizeReport:
    """Tokenize every record of ``files`` (an index frame with ``path``, ``fingerprint`` and optionally
    ``skipped``; or paths) in order, into chunks in ``chunks`` (default ``out_dir/chunks``) on ``engine``, and
    write the document index and quarantine file to the local folder ``out_dir``.

    Malformed records (and skipped paths) go to the quarantine file and are counted; chunks already in
    ``chunks`` with the same key are reused once their checksums match (see the module docstring), and
    chunks of other keys are removed. ``progress`` gets a line about once a second, and each warning.
    ``storage_options``: fsspec options for the source's files. With ``require_documents``, a source that
    read records but kept none raises :class:`DocumentsError` naming why (after writing its files).
    """
    if not isinstance(files, pl.DataFrame):
        files = pl.DataFrame({"path": list(files)}, schema={"path": pl.String})
    out_dir.mkdir(parents=True, exist_ok=True)
    chunks = chunks or Store(out_dir / "chunks")
    job, groups, todo, relocated = _chunk_work(spec, files, tokenizer, chunks, storage_options, engine)
    keys = [k for _g, k in groups]
    tokenized = {k for _g, k in todo}
    distributed = not isinstance(engine, LocalEngine)
    started = ahead_since(engine, todo) or time.perf_counter()  # MB/s and seconds count the work done ahead
    warnings: list[str] = []
    damaged: list[str] = []

    def warn(msg: str) -> None:
        warnings.append(msg)
        LOG.warning(msg)
        progress(msg)

    def show_progress(files_done: int, chunks_done: int, docs: int, text_bytes: int) -> None:
        mb = text_bytes / 1e6
        rate = mb / max(time.perf_counter() - started, 1e-9)
        reused = len(keys) - len(todo)
        ev = TokenizeProgress(name, files_done, len(files), docs, mb, rate, reused + chunks_done, len(keys))
        progress(str(ev))
        PROGRESS_LOG.info(str(ev), extra={"progress": ev})

    # A distributed engine checks reused chunks' tokens on its workers; locally they are checked while read.
    bad = verify_chunks(engine, job, sorted(set(keys) - tokenized)) if distributed else {}
    for attempt in range(2):
        for k, why in bad.items():
            damaged.append(k)
            warn(f"chunk {k} of source {name!r} was damaged ({why}), re-tokenized")
            chunks.remove_tree(k)  # unlinks a hard link, never the old build's file
        todo += [(g, k) for g, k in groups if k in bad]
        tokenized |= set(bad)
        reused_files = len(files) - sum(len(g) for g, _k in todo)
        tokenize_missing(engine, job, todo, reused_files, started, show_progress)
        for stale in set(chunks.names()) - set(keys):
            chunks.remove_tree(stale)
        try:
            counts = write_index(name, keys, chunks, deep=not distributed, tokenizer=tokenizer.fingerprint, out=out_dir)
            break
        except ChunksDamaged as e:
            bad = e.bad
        if attempt or distributed:  # a chunk just written (or just verified) does not read back
            raise DocumentsError(
                f"source {name!r}: chunk(s) {', '.join(bad)} damaged right after being written or checked "
                f"({'; '.join(bad.values())}); check the storage under {chunks.url}"
            )
        todo = []
    for what, n in sorted(counts.missing.items(), key=lambda kv: -kv[1]):
        warn(f"source {name!r}: {n} of {counts.seen} records lack {what}")
    result = TokenizeReport(
        docs_seen=counts.seen,
        docs_kept=counts.kept,
        docs_quarantined=counts.quarantined,
        tokens=counts.tokens,
        bytes_in=counts.bytes_in,
        quarantine_reasons=dict(counts.reasons),
        quarantine_sample=counts.sample,
        chunks=len(keys),
        chunks_reused=len(set(keys) - tokenized),
        chunks_relocated=len(set(relocated) - tokenized),
        tokenizer=tokenizer.fingerprint,
        seconds=time.perf_counter() - started,
        missing_fields=dict(counts.missing),
        chunks_damaged=damaged,
        warnings=warnings,
        engine=engine.name,
        workers=engine.workers,
        chunk_records=tuple(counts.records),
    )
    if require_documents and result.docs_seen and not result.docs_kept:
        raise DocumentsError(_no_documents(name, result))
    return result


@dataclass(frozen=True)
class AheadWork:
    """What :func:`tokenize_source` will run on an engine for one source: its chunks to tokenize, largest
    first, and its reused chunks to check (:func:`tokenize_ahead`)."""

    job: ChunkJob
    todo: list[tuple[Group, str]]
    reused: list[str]

    @property
    def largest(self) -> int:
        """Input bytes of the largest chunk to tokenize (0 when none)."""
        return _bytes(self.todo[0][0]) if self.todo else 0

    def submit(self, engine: Engine) -> int:
        """Start it on ``engine``; the tasks started (0 on the local engine)."""
        return submit_ahead(engine, self.job, self.todo, self.reused)


def tokenize_ahead(
    spec: SourceSpec,
    files: pl.DataFrame,
    tokenizer: TextTokenizer,
    chunks: Store,
    storage_options: dict[str, Any] | None,
    engine: Engine,
) -> AheadWork:
    """The work :func:`tokenize_source` will do for these arguments on ``engine``, to start now
    (:meth:`AheadWork.submit`): its call collects the results, so the work of several sources runs side by
    side on a cluster while their stages still run one after another. Largest chunks first: the last tasks
    to run are the small ones, so workers finish together."""
    job, groups, todo, _relocated = _chunk_work(spec, files, tokenizer, chunks, storage_options, engine)
    missing = {k for _g, k in todo}
    reused = sorted({k for _g, k in groups} - missing)
    return AheadWork(job, sorted(todo, key=lambda gk: -_bytes(gk[0])), reused)


def _bytes(group: Group) -> int:
    return sum(row.get("size") or 0 for row in group)


def _chunk_work(
    spec: SourceSpec,
    files: pl.DataFrame,
    tokenizer: TextTokenizer,
    chunks: Store,
    storage_options: dict[str, Any] | None,
    engine: Engine,
) -> tuple[ChunkJob, list[tuple[Group, str]], list[tuple[Group, str]], list[str]]:
    """The source's chunk job, its chunks (rows, key) in order, those to tokenize: not in ``chunks``, or
    being tokenized ahead on ``engine`` (a listing may show one an ahead task has just written), and the keys of
    those just found by content under another key (:func:`relocate_chunks`: files that moved)."""
    placeholders = files["path"].str.extract_all(envvars.PLACEHOLDER.pattern).explode().drop_nulls().unique()
    env = envvars.shipped(placeholders.to_list())  # this process's values, for workers that lack them
    job = ChunkJob(spec, tokenizer, chunks.url, chunks.storage_options, storage_options, env)
    groups = chunk_groups(files, tokenizer, spec)
    have = present_keys(chunks)
    relocated = relocate_chunks(chunks, groups, have, tokenizer, spec, busy=lambda k: is_ahead(engine, k))
    have |= set(relocated)
    return job, groups, [(g, k) for g, k in groups if k not in have or is_ahead(engine, k)], relocated


def _no_documents(name: str, r: TokenizeReport) -> str:
    """One line: why no record of source ``name`` became a document."""
    first = r.quarantine_sample[0] if r.quarantine_sample else None
    where = f" (first: {first['file']}:{first['line']})" if first else ""
    if r.missing_fields:
        what, n = max(r.missing_fields.items(), key=lambda kv: kv[1])
        return f"source {name!r} has no documents: {n} of {r.docs_seen} records lack {what}{where}"
    reasons = ", ".join(f"{n} {reason}" for reason, n in Counter(r.quarantine_reasons).most_common(3))
    return f"source {name!r} has no documents: all {r.docs_seen} records were quarantined ({reasons}){where}"
