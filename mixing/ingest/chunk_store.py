"""A source's chunks in a build root (``<source>/chunks/<key>/``, any :class:`~contract.store.Store`):
which keys are there, tokenizing the missing ones on an engine, and checking them against their reports.

Each chunk is written by exactly one work item (:func:`tokenize_missing`): on the local engine with a local
root, by :func:`mixing.ingest.chunks.tokenize_chunks`'s pipelined loop straight into the folder (renamed into
place whole); otherwise each chunk is a task (:mod:`mixing.engine`) that tokenizes into a local temporary
folder on its worker and uploads the files, ``report.json`` last: the report is the chunk's commit record
(checksums of the other three files and of itself), so a chunk without one is not there, whatever else a
killed task left under its key, and a retried task simply writes it again.

A chunk whose files moved is found again under its old key by :mod:`mixing.ingest.relocation`.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from contract.store import Store, sha256_file
from mixing.engine import Engine, LocalEngine
from mixing.ingest.chunks import CHUNK_FILES, REPORT, ChunkDamaged, Group, tokenize_chunks
from mixing.ingest.tokenizer import TextTokenizer
from mixing.mixfile.mix import SourceSpec

__all__ = [
    "ChunkDone",
    "ChunkJob",
    "ChunkRead",
    "ChunkTokens",
    "check_chunk",
    "chunk_reports",
    "is_ahead",
    "present_keys",
    "submit_ahead",
    "tokenize_missing",
    "verify_chunks",
]


@dataclass(frozen=True)
class ChunkJob:
    """What every task of one source needs (shipped once per source to a distributed engine's workers)."""

    spec: SourceSpec
    tokenizer: TextTokenizer
    chunks_url: str  # the source's chunks/ folder in the build root
    chunks_options: dict[str, Any] | None  # fsspec options of the build root
    source_options: dict[str, Any] | None  # fsspec options of the source's files
    # the {env_NAME} values of the process that indexed the files (mixing.mixfile.envvars.shipped): a worker's
    # environment is its cluster's, which may lack them. Never shown (not in the repr).
    env: dict[str, str] = field(default_factory=dict, repr=False)

    def store(self) -> Store:
        return Store(self.chunks_url, self.chunks_options)


@dataclass(frozen=True)
class ChunkDone:
    """One chunk written: its key, files read, documents kept, bytes of text read."""

    key: str
    files: int
    documents: int
    bytes_in: int


@dataclass(frozen=True)
class ChunkRead:
    """A checked chunk: its report (``seen``, ``bytes_in``, ``reasons``, ``missing``), ``{name, bytes, sha256}``
    of its ``report.json``, and where its checked ``docs.parquet`` (``file``, ``line``, ``n_tokens``, ``meta``)
    and ``quarantine.jsonl`` can be read on the local disk (None when only checked)."""

    report: dict[str, Any]
    record: dict[str, Any]
    docs: Path | None = None
    quarantine: Path | None = None


def present_keys(chunks: Store) -> set[str]:
    """Keys of the chunks in ``chunks`` that have their ``report.json`` (one listing)."""
    return {p.split("/", 1)[0] for p in chunks.walk("") if p.count("/") == 1 and p.endswith("/" + REPORT)}


_READERS = 16  # reports read at once: an object store answers each in a round trip


def chunk_reports(chunks: Store, keys: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The report of each chunk of ``keys`` whose ``report.json`` reads and matches its own checksum (the others
    are left out: whoever reuses them checks them and says why), read :data:`_READERS` at a time."""

    def read(key: str) -> dict[str, Any] | None:
        try:
            return _report(chunks.read(f"{key}/{REPORT}"))
        except (OSError, ChunkDamaged):
            return None

    keys = list(keys)
    with ThreadPoolExecutor(min(_READERS, max(1, len(keys)))) as pool:
        return {k: rep for k, rep in zip(keys, pool.map(read, keys), strict=True) if rep is not None}


def tokenize_missing(
    engine: Engine,
    job: ChunkJob,
    todo: list[tuple[Group, str]],
    done_files: int,
    started: float,
    report: Callable[[int, int, int, int], None],
) -> None:
    """Tokenize the ``todo`` chunks (rows, key) into ``job``'s chunks folder on ``engine``.

    ``report(files done, chunks done, documents kept, bytes of text read)`` about once a second and at the end;
    files done start at ``done_files`` (the files of reused chunks). Raises what a task raised.
    """
    chunks = job.store()
    if isinstance(engine, LocalEngine) and chunks.local:  # the embedded default: one pipelined loop
        chunks.path.mkdir(parents=True, exist_ok=True)
        tokenize_chunks(
            job.spec, todo, job.tokenizer, chunks.path, job.source_options, done_files, started, report, job.env
        )
        return
    files, docs, text, last = done_files, 0, 0, 0.0
    for k, (_i, done) in enumerate(engine.map(_tokenize_one, todo, job, _TOKENIZE, key=_item_key), start=1):
        files, docs, text = files + done.files, docs + done.documents, text + done.bytes_in
        if time.perf_counter() - last >= 1.0 or k == len(todo):
            last = time.perf_counter()
            report(files, k, docs, text)


def submit_ahead(engine: Engine, job: ChunkJob, todo: list[tuple[Group, str]], reused: list[str]) -> int:
    """Start tokenizing the ``todo`` chunks and checking the ``reused`` ones on ``engine`` now; the calls of
    :func:`tokenize_missing` and :func:`verify_chunks` for them collect the results. Returns the tasks started
    (0 on an engine that cannot run work ahead)."""
    n = engine.submit_ahead(_tokenize_one, todo, job, _TOKENIZE, key=_item_key)
    return n + engine.submit_ahead(_verify_one, reused, job, _VERIFY, key=str)


def is_ahead(engine: Engine, key: str) -> bool:
    """Whether chunk ``key`` is being tokenized ahead (so a listing may show it, yet this build writes it)."""
    return engine.is_ahead(_TOKENIZE, key)


def ahead_since(engine: Engine, todo: list[tuple[Group, str]]) -> float | None:
    """When the first of the ``todo`` chunks still being tokenized ahead was submitted (``time.perf_counter``)."""
    return engine.ahead_since(_TOKENIZE, [k for _g, k in todo])


_TOKENIZE, _VERIFY = "tokenize_chunk", "verify_chunk"  # task names (``ray::tokenize_chunk`` in ``ps``)


def _item_key(item: tuple[Group, str]) -> str:
    return item[1]


def _tokenize_one(job: ChunkJob, item: tuple[Group, str]) -> ChunkDone:
    """One chunk on this worker: into a local root, written beside its place and renamed into it whole (as the
    local engine does); into an object store, written to a temporary folder and uploaded, ``report.json`` last."""
    group, key = item
    chunks = job.store()

    def tokenize(into: Path) -> None:
        opts = job.source_options
        tokenize_chunks(job.spec, [item], job.tokenizer, into, opts, 0, time.perf_counter(), _quiet, job.env)

    if chunks.local:  # no copy: a rename publishes it (a killed task leaves only a hidden temporary folder)
        chunks.path.mkdir(parents=True, exist_ok=True)
        tokenize(chunks.path)
        return _done(chunks.path / key, key, len(group))
    with tempfile.TemporaryDirectory(prefix="weir-chunk-") as tmp:
        tokenize(Path(tmp))
        local = Path(tmp) / key
        for name in CHUNK_FILES:
            chunks.put_file(f"{key}/{name}", local / name)
        chunks.put_file(f"{key}/{REPORT}", local / REPORT)  # last: the chunk exists from here on
        return _done(local, key, len(group))


def _quiet(*_: object) -> None:
    pass


def _done(folder: Path, key: str, files: int) -> ChunkDone:
    rep = json.loads((folder / REPORT).read_text())
    kept = pl.read_parquet(folder / "docs.parquet", columns=["n_tokens"]).height
    return ChunkDone(key, files, kept, int(rep["bytes_in"]))


def verify_chunks(engine: Engine, job: ChunkJob, keys: list[str]) -> dict[str, str]:
    """Check every file of the chunks ``keys`` against their reports, on ``engine``; {key: what is wrong}."""
    return {keys[i]: why for i, why in engine.map(_verify_one, keys, job, _VERIFY, key=str) if why}


def _verify_one(job: ChunkJob, key: str) -> str | None:
    try:
        check_chunk(job.store(), key, tokens=True)
    except ChunkDamaged as e:
        return str(e)
    return None


def check_chunk(chunks: Store, key: str, *, tokens: bool, into: Path | None = None) -> ChunkRead:
    """Check chunk ``key``'s report and files against the report's sha256 (``tokens.bin`` too when ``tokens``);
    raises :class:`ChunkDamaged`. Files are streamed, never held: with ``into`` None they are only hashed where
    they are; with a local folder ``into``, ``docs.parquet`` and ``quarantine.jsonl`` are read there afterwards
    (a local chunk's own files, or copies downloaded into ``into``, replacing the previous chunk's), and what is
    hashed is what will be read."""
    try:
        raw_report = chunks.read(f"{key}/{REPORT}")
        rep = _report(raw_report)
        sums = rep["sha256"]
        if tokens:
            got = chunks.digest(f"{key}/tokens.bin")
            if got is None or got[1] != sums.get("tokens.bin"):
                raise ChunkDamaged("tokens.bin sha256 mismatch" if got else "tokens.bin missing")
        paths: dict[str, Path] = {}
        for name in CHUNK_FILES[1:]:
            if into is None:
                got = chunks.digest(f"{key}/{name}")
                if got is None:
                    raise ChunkDamaged(f"{name} missing")
                digest = got[1]
            else:
                paths[name] = chunks.path / key / name if chunks.local else into / name
                if not chunks.local:
                    chunks.get_file(f"{key}/{name}", paths[name])
                digest = sha256_file(paths[name])
            if digest != sums.get(name):
                raise ChunkDamaged(f"{name} sha256 mismatch")
    except (OSError, ValueError) as e:  # FileNotFoundError and the object stores' own errors
        where = getattr(e, "filename", None)
        file = f" ({Path(where).name})" if where else ""
        raise ChunkDamaged(f"{type(e).__name__}: {getattr(e, 'strerror', None) or e}{file}") from None
    record = {"name": f"{key}/{REPORT}", "bytes": len(raw_report), "sha256": hashlib.sha256(raw_report).hexdigest()}
    return ChunkRead(rep, record, paths.get("docs.parquet"), paths.get("quarantine.jsonl"))


def _report(raw: bytes) -> dict[str, Any]:
    """A chunk's report.json, checked against its own checksum; raises :class:`ChunkDamaged`."""
    try:
        rep = json.loads(raw)
        check = rep.pop("check")
        body = json.dumps(rep, sort_keys=True)
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        raise ChunkDamaged(f"report.json unreadable: {type(e).__name__}") from None
    if hashlib.sha256(body.encode()).hexdigest() != check or not isinstance(rep.get("sha256"), dict):
        raise ChunkDamaged("report.json checksum mismatch")
    return rep  # type: ignore[no-any-return]


class ChunkTokens:
    """Token ranges of the chunks in ``chunks``: memory maps of a local folder, ranged reads of a remote one."""

    def __init__(self, chunks: Store) -> None:
        self.chunks = chunks
        self._maps: dict[str, np.ndarray] = {}

    def ranges(self, key: str, starts: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
        """Tokens ``[starts[i], starts[i] + lengths[i])`` (token units, uint32) of chunk ``key``, one array each
        (local: views of the map; remote: every range of the call fetched concurrently)."""
        if self.chunks.local:
            m = self._maps.get(key)
            if m is None:
                path = self.chunks.path / key / "tokens.bin"
                m = np.memmap(path, dtype="<u4", mode="r") if path.stat().st_size else np.zeros(0, "<u4")
                self._maps[key] = m
            return [m[s : s + n] for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)]
        ends = (starts + lengths) * 4
        raw = self.chunks.read_ranges(f"{key}/tokens.bin", (starts * 4).tolist(), ends.tolist())
        return [np.frombuffer(b, dtype="<u4") for b in raw]
