"""A source's chunks in a build root (``<source>/chunks/<key>/``, any :class:`~contract.store.Store`):
which keys are there, tokenizing the missing ones on an engine, and checking them against their reports.

Each chunk is written by exactly one work item (:func:`tokenize_missing`): on the local engine with a local
root, by :func:`mixing.ingest.chunks.tokenize_chunks`'s pipelined loop straight into the folder (renamed into
place whole); otherwise each chunk is a task (:mod:`mixing.engine`) that tokenizes into a local temporary
folder on its worker and uploads the files, ``report.json`` last: the report is the chunk's commit record
(checksums of the other three files and of itself), so a chunk without one is not there, whatever else a
killed task left under its key, and a retried task simply writes it again.

A chunk whose files moved (the source's folder moved, copied to another machine, or reached through a link:
other paths, so other keys) is not tokenized again when its documents are still there under the old key:
:func:`relocate_chunks` finds it by its content key (:func:`mixing.ingest.chunks.content_key`) and writes it
under the new key, its tokens linked (or copied within the store) and its documents and quarantine naming the
files where they are now.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from contract.store import Store, sha256_file
from mixing.engine import Engine, LocalEngine
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
    tokenize_chunks,
    write_report,
)
from mixing.ingest.sources import file_name
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
    "relocate_chunks",
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
