"""mixing/ingest/chunk_store.py: a chunk is the same bytes whichever engine and root wrote it (the local engine's
pipelined loop, a task renaming into a local root, a task uploading to an object store); a chunk is there exactly
when its ``report.json`` is; :func:`check_chunk` passes every intact chunk and names any damaged file in one line,
on a local root and on a remote one; :func:`verify_chunks` names exactly the damaged keys; :class:`ChunkTokens`
reads the same token ranges from a memory map and from ranged remote reads.

(Reuse of cached chunks inside ``tokenize_source``: test_chunks.py and tests/faults/test_ingest_chunks.py. A
remote root here is fsspec's ``memory://`` filesystem: a real fsspec store that is not local.)"""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.store import Store
from mixing.engine import Engine, LocalEngine
from mixing.ingest.chunk_store import (
    ChunkJob,
    ChunkTokens,
    check_chunk,
    present_keys,
    tokenize_missing,
    verify_chunks,
)
from mixing.ingest.chunks import CHUNK_FILES, REPORT, ChunkDamaged, Group
from mixing.ingest.tokenizer import load_tokenizer
from mixing.mixfile.mix import SourceSpec, TokenizerSpec

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")

FILES = (*CHUNK_FILES, REPORT)
SPEC = SourceSpec(uri="unused", format="jsonl", metadata=("tag",))
DONE_BEFORE = 7  # files of reused chunks: the progress count starts there


@dataclass(frozen=True)
class LastFirst:
    """An engine other than the local one (so each chunk is a task, as on Ray): every item runs in this
    process, and the results are yielded last first, as a distributed engine yields them in any order."""

    name: str = "last-first"

    @property
    def workers(self) -> int:
        return 1

    def map(
        self, fn: Callable[[S, T], R], items: Iterable[T], shared: S, label: str, key: Any = None
    ) -> Iterator[tuple[int, R]]:
        done = [(i, fn(shared, item)) for i, item in enumerate(items)]
        yield from reversed(done)

    def submit_ahead(self, fn: Callable[[S, T], R], items: Iterable[T], shared: S, label: str, key: Any) -> int:
        return 0

    def is_ahead(self, label: str, key: str) -> bool:
        return False

    def ahead_since(self, label: str, keys: Iterable[str]) -> float | None:
        return None

    def forget(self) -> None:
        pass


@dataclass
class Source:
    todo: list[tuple[Group, str]]
    kept: int  # documents with text
    tokenizer: Any

    @property
    def keys(self) -> list[str]:
        return [k for _g, k in self.todo]

    @property
    def files(self) -> int:
        return sum(len(g) for g, _k in self.todo)


@pytest.fixture
def source(tmp_path: Path) -> Source:
    """Five chunks of six jsonl files (each chunk with malformed lines) and a sixth of malformed lines only."""
    data = tmp_path / "data"
    data.mkdir()
    rows, kept = [], 0
    for i in range(32):
        good = 0 if i >= 30 else i % 4 + 1
        lines = [json.dumps({"text": f"doc {i}-{j} " * (j + 1), "tag": i}) for j in range(good)]
        lines += ["{broken"] if i % 3 == 0 or i >= 30 else []
        (data / f"f{i:02d}.jsonl").write_text("".join(line + "\n" for line in lines))
        rows.append({"path": str(data / f"f{i:02d}.jsonl"), "fingerprint": f"fp{i}"})
        kept += good
    todo = [(rows[s : s + 6], f"chunk{s:02d}") for s in range(0, 32, 6)]
    assert len(todo) == 6 and len(todo[-1][0]) == 2
    return Source(todo, kept, load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path))


@pytest.fixture
def remote() -> Iterator[Store]:
    """An empty folder of fsspec's in-memory filesystem (not local: written and read as an object store)."""
    store = Store(f"memory://weir-test-{uuid.uuid4().hex}/chunks")
    assert not store.local
    yield store
    store.remove_tree("")


def write(source: Source, engine: Engine, chunks: Store) -> list[tuple[int, int, int, int]]:
    """Tokenize every chunk of ``source`` into ``chunks`` on ``engine``; the progress reports it made."""
    reports: list[tuple[int, int, int, int]] = []
    job = ChunkJob(SPEC, source.tokenizer, chunks.url, chunks.storage_options, None)
    tokenize_missing(engine, job, source.todo, DONE_BEFORE, 0.0, lambda *a: reports.append(a))
    return reports


def contents(chunks: Store, keys: list[str]) -> dict[str, bytes]:
    return {f"{k}/{name}": chunks.read(f"{k}/{name}") for k in keys for name in FILES}


# --- writing ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["task into a local root", "task into an object store", "local loop"])
def test_every_engine_and_root_writes_the_same_chunks_and_reports_them_all(
    source: Source, tmp_path: Path, remote: Store, where: str
) -> None:
    reference = Store(tmp_path / "reference")
    write(source, LocalEngine(), reference)
    expected = contents(reference, source.keys)
    engine: Engine = LocalEngine() if where == "local loop" else LastFirst()
    chunks = remote if "object store" in where else Store(tmp_path / "out")
    reports = write(source, engine, chunks)
    assert contents(chunks, source.keys) == expected
    assert present_keys(chunks) == set(source.keys)
    assert chunks.walk("") == sorted(expected)  # nothing else: no temporary file left behind
    text = sum(json.loads(expected[f"{k}/{REPORT}"])["bytes_in"] for k in source.keys)
    assert reports[-1] == (DONE_BEFORE + source.files, len(source.todo), source.kept, text)
    for before, after in itertools.pairwise(reports):  # progress only grows
        assert all(a <= b for a, b in zip(before, after, strict=True))


def test_the_chunks_documents_are_the_records_with_text(source: Source, tmp_path: Path) -> None:
    chunks = Store(tmp_path / "out")
    write(source, LocalEngine(), chunks)
    for group, key in source.todo:
        docs = pl.read_parquet(chunks.path / key / "docs.parquet")
        tokens = np.fromfile(chunks.path / key / "tokens.bin", dtype="<u4")
        assert int(docs["n_tokens"].sum()) == len(tokens)  # token counts partition tokens.bin
        assert set(docs["file"]) <= {row["path"] for row in group}
        quarantined = (chunks.path / key / "quarantine.jsonl").read_text().splitlines()
        report = check_chunk(chunks, key, tokens=True).report
        assert report["seen"] == docs.height + len(quarantined)
        assert report["reasons"] == ({"invalid JSON": len(quarantined)} if quarantined else {})


# --- presence ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("root", ["local", "remote"])
def test_a_chunk_is_present_exactly_when_its_report_is(
    source: Source, tmp_path: Path, remote: Store, root: str
) -> None:
    chunks = remote if root == "remote" else Store(tmp_path / "out")
    assert present_keys(chunks) == set()  # no folder yet
    write(source, LocalEngine() if root == "local" else LastFirst(), chunks)
    first, second, *_ = source.keys
    chunks.remove(f"{first}/{REPORT}")  # a task killed before its last upload: its other files stay
    chunks.put("killed/tokens.bin", b"\0\0\0\0")
    chunks.put(REPORT, b"{}")  # a report outside any chunk folder
    chunks.put(f"nested/deeper/{REPORT}", b"{}")  # and one too deep
    assert present_keys(chunks) == set(source.keys) - {first}
    chunks.remove_tree(second)
    assert present_keys(chunks) == set(source.keys) - {first, second}
    retried = Source([gk for gk in source.todo if gk[1] in (first, second)], 0, source.tokenizer)
    write(retried, LastFirst(), chunks)  # a retried task simply writes its chunk again, over what was left
    assert present_keys(chunks) == set(source.keys)
    reference = Store(tmp_path / "reference")
    write(source, LocalEngine(), reference)
    assert contents(chunks, source.keys) == contents(reference, source.keys)


# --- checking ----------------------------------------------------------------------------------------------------


def test_an_intact_chunk_checks_and_reads_where_it_is_or_where_it_was_downloaded(
    source: Source, tmp_path: Path, remote: Store
) -> None:
    local = Store(tmp_path / "out")
    write(source, LocalEngine(), local)
    write(source, LastFirst(), remote)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    for key in source.keys:  # one scratch folder for every chunk: each download replaces the previous chunk's
        raw = local.read(f"{key}/{REPORT}")
        report = json.loads(raw)
        report.pop("check")
        for chunks in (local, remote):
            for tokens in (True, False):
                got = check_chunk(chunks, key, tokens=tokens)
                assert got.report == report and (got.docs, got.quarantine) == (None, None)
            read = check_chunk(chunks, key, tokens=True, into=scratch)
            assert read.record == {"name": f"{key}/{REPORT}", "bytes": len(raw), "sha256": report_sha(raw)}
            assert read.docs is not None and read.quarantine is not None
            if chunks.local:  # a local chunk's own files, not copies
                assert (read.docs, read.quarantine) == (
                    local.path / key / "docs.parquet",
                    local.path / key / "quarantine.jsonl",
                )
            else:
                assert read.docs.parent == scratch and read.quarantine.parent == scratch
            assert read.docs.read_bytes() == local.read(f"{key}/docs.parquet")
            assert read.quarantine.read_bytes() == local.read(f"{key}/quarantine.jsonl")


def report_sha(raw: bytes) -> str:
    import hashlib

    return hashlib.sha256(raw).hexdigest()


@settings(max_examples=60)
@given(name=st.sampled_from(FILES), at=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7), remote=st.booleans())
def test_a_flipped_bit_in_any_file_is_damage_named_in_one_line(
    checked_chunk: tuple[Store, Store, str], name: str, at: float, bit: int, remote: bool
) -> None:
    local, memory, key = checked_chunk
    chunks = memory if remote else local
    original = chunks.read(f"{key}/{name}")
    damaged = bytearray(original)
    damaged[int(at * len(damaged))] ^= 1 << bit
    chunks.put(f"{key}/{name}", bytes(damaged))
    try:
        if name == "tokens.bin":  # only a deep check reads the tokens
            check_chunk(chunks, key, tokens=False)
        with pytest.raises(ChunkDamaged) as e:
            check_chunk(chunks, key, tokens=True)
        msg = str(e.value)
        assert "\n" not in msg and (name in msg), msg
    finally:
        chunks.put(f"{key}/{name}", original)
    check_chunk(chunks, key, tokens=True)  # restored: intact again


def copy_chunk(chunks: Store, key: str) -> str:
    """A copy of chunk ``key`` under a new key, to damage without touching the original."""
    new = f"copy-{uuid.uuid4().hex[:8]}"
    for name in FILES:
        chunks.put(f"{new}/{name}", chunks.read(f"{key}/{name}"))
    check_chunk(chunks, new, tokens=True)
    return new


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("root", ["local", "remote"])
def test_an_emptied_or_missing_file_is_damage(checked_chunk: tuple[Store, Store, str], name: str, root: str) -> None:
    local, memory, key = checked_chunk
    chunks = memory if root == "remote" else local
    copy = copy_chunk(chunks, key)
    chunks.put(f"{copy}/{name}", b"")
    with pytest.raises(ChunkDamaged) as e:
        check_chunk(chunks, copy, tokens=True)
    assert "\n" not in str(e.value) and name in str(e.value), str(e.value)
    chunks.remove(f"{copy}/{name}")
    with pytest.raises(ChunkDamaged) as e:
        check_chunk(chunks, copy, tokens=True)
    assert "\n" not in str(e.value)
    with pytest.raises(ChunkDamaged):
        check_chunk(chunks, "no-such-key", tokens=False)


@pytest.fixture(scope="module")
def checked_chunk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Store, str]]:
    """One chunk with tokens, documents and quarantined lines, on a local root and on a remote one."""
    tmp = tmp_path_factory.mktemp("checked")
    (tmp / "a.jsonl").write_text(
        "".join(json.dumps({"text": f"document {i} " * 5, "tag": i}) + "\n" for i in range(5)) + "{broken\n"
    )
    tok = load_tokenizer(TokenizerSpec(kind="bytes"), tmp)
    src = Source([([{"path": str(tmp / "a.jsonl"), "fingerprint": "a"}], "k")], 5, tok)
    local = Store(tmp / "chunks")
    write(src, LocalEngine(), local)
    memory = Store(f"memory://weir-test-{uuid.uuid4().hex}/chunks")
    for name in FILES:
        memory.put_file(f"k/{name}", local.path / "k" / name)
    assert all(local.size(f"k/{name}") for name in FILES)  # every file has a byte to flip
    yield local, memory, "k"
    memory.remove_tree("")


@pytest.mark.parametrize("engine", [LocalEngine(), LastFirst()], ids=["local", "last-first"])
def test_verify_chunks_names_exactly_the_damaged_keys(source: Source, remote: Store, engine: Engine) -> None:
    write(source, LastFirst(), remote)
    job = ChunkJob(SPEC, source.tokenizer, remote.url, remote.storage_options, None)
    assert verify_chunks(engine, job, source.keys) == {}
    hit = {source.keys[0]: "tokens.bin", source.keys[3]: "docs.parquet", source.keys[4]: REPORT}
    for key, name in hit.items():
        raw = bytearray(remote.read(f"{key}/{name}"))
        raw[len(raw) // 2] ^= 0x01
        remote.put(f"{key}/{name}", bytes(raw))
    remote.remove(f"{source.keys[1]}/quarantine.jsonl")
    bad = verify_chunks(engine, job, source.keys)
    assert set(bad) == {*hit, source.keys[1]}
    for key, name in hit.items():
        assert name in bad[key] and "\n" not in bad[key]


@pytest.mark.parametrize("name", CHUNK_FILES[1:])
@pytest.mark.parametrize("root", ["local", "remote"])
def test_a_missing_file_is_named_in_the_damage(checked_chunk: tuple[Store, Store, str], name: str, root: str) -> None:
    local, memory, key = checked_chunk
    chunks = memory if root == "remote" else local
    copy = copy_chunk(chunks, key)
    chunks.remove(f"{copy}/{name}")
    with pytest.raises(ChunkDamaged) as e:
        check_chunk(chunks, copy, tokens=True)
    assert name in str(e.value), str(e.value)  # what verify_chunks reports and the build's warning shows


# --- reading tokens ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def token_chunks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, Store, dict[str, np.ndarray]]]:
    """Two chunks' tokens.bin (one of them empty) on a local root and on a remote one, and their tokens."""
    rng = np.random.default_rng(0)
    tokens = {"full": rng.integers(0, 2**32, size=5000, dtype=np.uint32), "empty": np.zeros(0, np.uint32)}
    local = Store(tmp_path_factory.mktemp("tokens"))
    memory = Store(f"memory://weir-test-{uuid.uuid4().hex}/chunks")
    for key, arr in tokens.items():
        for store in (local, memory):
            store.put(f"{key}/tokens.bin", arr.astype("<u4").tobytes())
    yield local, memory, tokens
    memory.remove_tree("")


@settings(max_examples=60)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 5000)), max_size=40))
def test_token_ranges_are_the_same_from_a_map_and_from_ranged_reads(
    token_chunks: tuple[Store, Store, dict[str, np.ndarray]], bounds: list[tuple[int, int]]
) -> None:
    local, memory, tokens = token_chunks
    arr = tokens["full"]
    starts = np.array([min(a, b) for a, b in bounds], dtype=np.int64)
    lengths = np.array([abs(a - b) for a, b in bounds], dtype=np.int64)
    for store in (local, memory):
        got = ChunkTokens(store).ranges("full", starts, lengths)
        assert len(got) == len(bounds)
        for g, s, n in zip(got, starts.tolist(), lengths.tolist(), strict=True):
            assert g.dtype == np.dtype("<u4") and np.array_equal(g, arr[s : s + n])


def test_an_empty_chunk_has_only_empty_ranges(token_chunks: tuple[Store, Store, dict[str, np.ndarray]]) -> None:
    local, memory, _tokens = token_chunks
    for store in (local, memory):
        reader = ChunkTokens(store)
        got = reader.ranges("empty", np.zeros(3, np.int64), np.zeros(3, np.int64))
        assert [g.tolist() for g in got] == [[], [], []]
        again = reader.ranges("full", np.array([4999]), np.array([1]))  # readers of several chunks at once
        assert again[0].tolist() == [int(_tokens["full"][-1])]
