"""``contract.index``, the writer's side: ``item_cu_seqlens`` is each sequence's boundaries with its padding as one
more segment (int32, any slice of sequences alike); ``write_index`` holds the shards' metadata concatenated, the
same bytes however the build is split into shards, and records ``index_version``, the manifest checksum and every
file's size and sha256; ``map_index`` maps them read-only and refuses (``ValueError`` naming the file) files of
the wrong rows, shape or content. (The loader's use of the index is ``tests/loaders/test_index.py``'s.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.index import ARRAYS, INDEX, INDEX_VERSION, item_cu_seqlens, map_index, write_index
from contract.shards import ShardSet
from contract.store import sha256_file
from mixing.output.shard_writer import write_shards

BUILDS = settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@st.composite
def segmentations(draw: st.DrawFn, max_n: int = 10) -> tuple[int, list[list[int]]]:
    """(S, each sequence's segment lengths, ≤ S in all; an empty list is a sequence of padding only)."""
    seq_len = draw(st.integers(1, 40))
    seqs = []
    for _ in range(draw(st.integers(0, max_n))):
        lens: list[int] = []
        for ln in draw(st.lists(st.integers(1, seq_len), max_size=6)):
            if sum(lens) + ln > seq_len:
                break
            lens.append(ln)
        seqs.append(lens)
    return seq_len, seqs


def arrays(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(seg_offsets [n+1], lengths [m], used [n]) of ``seqs``."""
    off = np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64)
    lengths = np.array([ln for s in seqs for ln in s], dtype=np.int64)
    return off, lengths, np.array([sum(s) for s in seqs], dtype=np.int64)


def boundaries(lens: list[int], seq_len: int) -> list[int]:
    """A sequence's documented boundaries: 0, each document's end, and the padding's (if any)."""
    return np.cumsum([0, *lens, *([seq_len - sum(lens)] if sum(lens) < seq_len else [])]).tolist()


def write_build(folder: Path, seq_len: int, seqs: list[list[int]], shard_sequences: int, seed: int = 0) -> ShardSet:
    rng = np.random.default_rng(seed)
    n = len(seqs)
    off, lengths, _ = arrays(seqs)
    segments = np.stack(
        [rng.integers(0, 3, len(lengths)), rng.integers(0, 1000, len(lengths)), np.zeros(len(lengths)), lengths],
        axis=1,
    ).astype(np.int64)
    tokens = rng.integers(0, 500, (n, seq_len)).astype(np.uint16)
    step = np.sort(rng.integers(0, 4, n)).astype(np.int64)
    info = {"cost": {"attention": 1.5, "linear": 2.0}, "sources": ["a", "b", "c"]}
    write_shards(folder, tokens, step, off, segments, shard_sequences, info, seq_len=seq_len)
    return ShardSet(folder)


@given(case=segmentations(max_n=30), cut=st.tuples(st.integers(0, 30), st.integers(0, 30)))
def test_item_cu_seqlens_are_the_documented_boundaries_of_any_slice(
    case: tuple[int, list[list[int]]], cut: tuple[int, int]
) -> None:
    seq_len, seqs = case
    off, lengths, used = arrays(seqs)
    cu, count = item_cu_seqlens(off, lengths, used, seq_len)
    assert cu.dtype == np.int32 and count.dtype == np.int64 and count.shape == (len(seqs),)
    heads = np.concatenate([[0], np.cumsum(count)])
    assert heads[-1] == len(cu)
    for i, lens in enumerate(seqs):
        assert cu[heads[i] : heads[i + 1]].tolist() == boundaries(lens, seq_len)
    a, b = sorted(min(c, len(seqs)) for c in cut)  # sequences a..b-1 alone: offsets that need not start at 0
    part, part_count = item_cu_seqlens(off[a : b + 1], lengths, used[a:b], seq_len)
    assert part.tolist() == cu[heads[a] : heads[b]].tolist() and part_count.tolist() == count[a:b].tolist()


@BUILDS
@given(case=segmentations(), per=st.tuples(st.integers(1, 11), st.integers(1, 11)), verified=st.booleans())
def test_the_index_is_the_shards_metadata_whatever_the_split_into_shards(
    tmp_path_factory: pytest.TempPathFactory,
    case: tuple[int, list[list[int]]],
    per: tuple[int, int],
    verified: bool,
) -> None:
    seq_len, seqs = case
    root = tmp_path_factory.mktemp("ix")
    records = []
    for k, shard_sequences in enumerate(per):
        shards = write_build(root / f"b{k}", seq_len, seqs, shard_sequences)
        (root / f"ix{k}").mkdir()
        digest = f"{k:064x}"
        record = write_index(shards, root / f"ix{k}", digest, meta_verified=verified)
        assert record == json.loads((root / f"ix{k}" / INDEX).read_text())
        assert (record["index_version"], record["manifest_sha256"], record["meta_verified"]) == (
            INDEX_VERSION,
            digest,
            verified,
        )
        for name, f in record["files"].items():
            path = root / f"ix{k}" / f["name"]
            assert f["name"] == f"{name}.npy" and (f["bytes"], f["sha256"]) == (path.stat().st_size, sha256_file(path))
        records.append(record)
    assert records[0]["files"] == records[1]["files"]  # the same bytes, however the build was split

    ix = map_index(root / "ix0", len(seqs))
    metas = [shards.shard_meta(k) for k in range(len(shards.manifest.shards))]
    for name in ("step", "seq_tokens", "seq_cost", "segments", "seg_cost"):
        want = np.concatenate([m[name] for m in metas]) if metas else np.zeros((0, *ARRAYS[name][1]))
        assert np.array_equal(ix[name], want), name
    off, lengths, _ = arrays(seqs)
    assert ix["seg_offsets"].tolist() == off.tolist() and ix["segments"][:, 3].tolist() == lengths.tolist()
    for i, lens in enumerate(seqs):
        assert ix["cu_seqlens"][ix["cu_offsets"][i] : ix["cu_offsets"][i + 1]].tolist() == boundaries(lens, seq_len)
        # a loader item's segments: the sequence's own, then one row of -1 for its padding, one per boundary gap
        own = ix["segments"][off[i] : off[i + 1], :3].tolist() + [[-1, -1, -1]] * (sum(lens) < seq_len)
        assert ix["item_segments"][ix["cu_offsets"][i] - i : ix["cu_offsets"][i + 1] - i - 1].tolist() == own
    for name, (dtype, tail) in ARRAYS.items():  # plain .npy files: numpy reads them without a map too
        plain = np.load(root / "ix0" / f"{name}.npy", allow_pickle=False)
        assert plain.dtype == np.dtype(dtype) and plain.shape[1:] == tail and np.array_equal(plain, ix[name])
        assert type(ix[name]) is np.ndarray and not ix[name].flags.writeable


@pytest.fixture(scope="module")
def index_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A sound index of a small build, and its sequences."""
    root = tmp_path_factory.mktemp("index")
    seqs = [[5, 7], [], [16], [1] * 16, [3, 3, 3], [15]]
    (root / "ix").mkdir()
    write_index(write_build(root / "b", 16, seqs, 4), root / "ix", "0" * 64, meta_verified=True)
    return root / "ix", len(seqs)


def damage(folder: Path, how: str) -> None:
    def put(name: str, arr: np.ndarray) -> None:
        np.save(folder / f"{name}.npy", arr)

    ix = {name: np.load(folder / f"{name}.npy") for name in ARRAYS}
    if how == "missing":
        (folder / "seg_cost.npy").unlink()
    elif how == "garbage":
        (folder / "seq_cost.npy").write_bytes(b"\x93NUMPY not really")
    elif how == "cut":
        data = (folder / "segments.npy").read_bytes()
        (folder / "segments.npy").write_bytes(data[: len(data) - 8])
    elif how == "shape":
        put("segments", ix["segments"][:, :3])
    elif how == "rows":
        put("seq_tokens", ix["seq_tokens"][:-1])
    elif how == "items":
        put("item_segments", ix["item_segments"][1:])
    elif how == "offsets":
        off = ix["cu_offsets"].copy()
        off[-1] -= 1
        put("cu_offsets", off)


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("missing", r"seg_cost\.npy: not a readable \.npy file"),
        ("garbage", r"seq_cost\.npy: not a readable \.npy file"),
        ("cut", r"segments\.npy: not a readable \.npy file"),
        ("shape", r"segments\.npy: holds int64 \(\d+, 3\), expected int64"),
        ("rows", r"seq_tokens\.npy: 5 rows, expected 6"),
        ("items", r"item_segments\.npy: \d+ rows, expected \d+"),
        ("offsets", r"the offsets do not end at the arrays' lengths"),
        ("sequences", r"step\.npy: 6 rows, expected 7"),
    ],
)
def test_map_index_refuses_files_that_do_not_fit_naming_them(
    index_folder: tuple[Path, int], tmp_path: Path, how: str, says: str
) -> None:
    folder, n = index_folder
    assert len(map_index(folder, n)["step"]) == n
    copy = tmp_path / "ix"
    shutil.copytree(folder, copy)
    damage(copy, how)
    with pytest.raises(ValueError, match=says):
        map_index(copy, n + (how == "sequences"))
