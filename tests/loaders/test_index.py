"""The node's index of a build (``loaders.index``): memory-mapped rather than copied, the very items of the
shards' own metadata on every read path, made once per node, made again when damaged, old formats read."""

from __future__ import annotations

import json
import mmap
import multiprocessing
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from contract.index import ARRAYS, INDEX
from contract.store import sha256_file
from loaders import Balance, PackedDataset, PackedLoader, Payload, Reading, World
from loaders.feed import SegmentTable
from loaders.index import index_folder
from tests.loaders.segmentations import random_build

LEAN = ("input_ids", "cu_seqlens")


def mapped(arr: np.ndarray) -> bool:
    """Whether ``arr``'s memory is a file mapping (some base of it is an ``mmap``), not a copy."""
    base: Any = arr
    while base is not None:
        if isinstance(base, mmap.mmap):
            return True
        base = getattr(base, "base", None)
    return False


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def read(ds: PackedDataset, how: str) -> list[dict[str, Any]]:
    if how == "chunk":
        return list(ds)
    if how == "item":
        return [ds.item(i) for i in ds.rank_sequences()]
    return list(PackedLoader(ds, num_workers=2))


def folder_of(ds: PackedDataset, cache: Path) -> Path:
    return index_folder(cache, ds.shards.manifest_bytes)


def table_of(ds: PackedDataset) -> SegmentTable:
    """The segment table the item builder of ``ds`` reads (here: of a local build, the whole build's)."""
    return ds._feed.read(np.zeros(1, np.int64), np.empty((1, ds.facts.seq_len), np.int64))[0]


def test_the_index_arrays_are_memory_mapped_not_copied(sharded_build: Path, tmp_path: Path) -> None:
    ds = PackedDataset(
        sharded_build,
        world=World(0, 1),
        balance=Balance(window=2),
        payload=Payload(fields=LEAN),
        reading=Reading(cache_dir=tmp_path),
    )
    next(iter(ds))
    shards = ds.shards
    offs, segs = shards.segments
    table = table_of(ds)
    assert table.cu is not None
    cu, at = table.cu
    assert table.item_segments is not None
    arrays = [
        table.offsets,
        table.lengths,
        table.used,
        table.steps,
        shards.steps,
        shards.seq_tokens,
        shards.seq_cost,
        offs,
        segs,
        cu,
        at,
        table.item_segments,
        shards.sequence(5).segments,
    ]
    assert all(mapped(a) for a in arrays)
    assert shards.steps is shards.steps and ds.planner.shards is shards  # the planner reads the same maps
    assert all(meta == {} for _, meta in shards._open.values())  # no shard's meta.npz was read into memory
    assert {p.name for p in folder_of(ds, tmp_path).iterdir()} == {INDEX, *(f"{a}.npy" for a in ARRAYS)}


def test_loaders_of_two_index_versions_on_one_node_keep_their_own_index(
    tiny_build: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, recwarn: pytest.WarningsRecorder
) -> None:
    """Two jobs of different releases sharing a cache: neither remakes the other's index, nor warns."""
    kw: dict[str, Any] = {"world": World(0, 1), "reading": Reading(cache_dir=tmp_path)}
    first = folder_of(PackedDataset(tiny_build, **kw), tmp_path)
    made = (first / INDEX).stat().st_mtime_ns
    monkeypatch.setattr("loaders.index.INDEX_VERSION", 99)
    other = folder_of(PackedDataset(tiny_build, **kw), tmp_path)
    monkeypatch.undo()
    assert PackedDataset(tiny_build, **kw).shards.index is not None
    assert other != first and other.name.endswith(".v99") and (other / INDEX).exists()
    assert (first / INDEX).stat().st_mtime_ns == made
    assert not [w for w in recwarn if "index" in str(w.message)]


@pytest.mark.parametrize("how", ["chunk", "item", "workers"])
@pytest.mark.parametrize("cp", [1, 2])
def test_items_equal_those_read_from_the_shards_own_metadata(
    tiny_build: Path, sharded_build: Path, tmp_path: Path, cp: int, how: str
) -> None:
    no_cache = tmp_path / "a-file"
    no_cache.write_text("")  # a cache_dir that cannot hold an index: the shards' metadata is read
    for build in (tiny_build, sharded_build):
        for fields in (None, LEAN) if cp == 1 else (None,):
            for window in (1, 2):
                kw: dict[str, Any] = {
                    "world": World(1, 2, cp - 1, cp),
                    "balance": Balance(window=window),
                    "payload": Payload(fields=fields, chunk=3),
                }
                with pytest.warns(UserWarning, match="cannot keep the build's index there"):
                    plain = PackedDataset(build, reading=Reading(cache_dir=no_cache), **kw)
                indexed = PackedDataset(build, reading=Reading(cache_dir=tmp_path / "cache"), **kw)
                assert plain.shards.index is None and indexed.shards.index is not None
                want, got = read(plain, how), read(indexed, how)
                assert len(want) == len(got) > 0
                assert all(same(a, b) for a, b in zip(want, got, strict=True))


def rewrite_as(build: Path, version: int, dest: Path) -> Path:
    """A copy of ``build`` as a format ``version`` build would have it: format 1 wrote only three metadata
    arrays, formats 1 and 2 no manifest checksum."""
    shutil.copytree(build / "shards", dest / "shards")
    path = dest / "shards" / "manifest.json"
    m = json.loads(path.read_text())
    if version == 1:
        for shard in m["shards"]:
            f = shard["files"]["meta"]
            meta = dest / "shards" / f["name"]
            with np.load(meta) as z:
                old = {k: z[k] for k in ("step", "seg_offsets", "segments")}
            with meta.open("wb") as out:
                np.savez(out, **old)
            f["bytes"], f["sha256"] = meta.stat().st_size, sha256_file(meta)
    m.pop("manifest_sha256")
    path.write_text(json.dumps({**m, "format_version": version}))
    return dest


@pytest.mark.parametrize("version", [1, 2])
def test_old_format_builds_read_through_the_index(sharded_build: Path, tmp_path: Path, version: int) -> None:
    old = rewrite_as(sharded_build, version, tmp_path / "old")
    for cp, fields in ((1, LEAN), (2, None)):
        want = list(
            PackedDataset(
                sharded_build,
                world=World(0, 1, cp - 1, cp),
                balance=Balance(window=2),
                payload=Payload(fields=fields),
                reading=Reading(cache_dir=tmp_path / "c3"),
            )
        )
        ds = PackedDataset(
            old,
            world=World(0, 1, cp - 1, cp),
            balance=Balance(window=2),
            payload=Payload(fields=fields),
            reading=Reading(cache_dir=tmp_path / "c"),
        )
        assert ds.shards.manifest.format_version == version and ds.shards.index is not None
        got = list(ds)
        assert len(got) == len(want) and all(same(a, b) for a, b in zip(want, got, strict=True))


def test_a_random_segmentation_gives_the_same_index_as_the_shards(tmp_path: Path) -> None:
    lens = [[5, 7], [], [24], [1] * 24, [3, 3, 3], [23], [12, 12], [2]]
    build = random_build(tmp_path, lens, 24, 0, shard_sequences=3)
    ds = PackedDataset(
        build, world=World(0, 1), payload=Payload(fields=LEAN), reading=Reading(cache_dir=tmp_path / "cache")
    )
    cu, at = table_of(ds).cu or (None, None)
    assert cu is not None and at is not None
    for i, seg in enumerate(lens):
        want = np.cumsum([0, *seg, *([24 - sum(seg)] if sum(seg) < 24 else [])])
        assert cu[at[i] : at[i + 1]].tolist() == want.tolist()
        assert ds.shards.seq_tokens[i] == sum(seg) and ds.shards.sequence(i).segments[:, 3].tolist() == seg


def damage(path: Path, how: str) -> None:
    stat = path.stat()
    data = bytearray(path.read_bytes())
    if how == "flip":
        data[-1] ^= 0x10
    path.write_bytes(bytes(data[:-8] if how == "truncate" else data))
    os.utime(path, ns=(stat.st_mtime_ns + 10**9, stat.st_mtime_ns + 10**9))  # a change shows in its mtime


@pytest.mark.parametrize(
    ("target", "how", "verify", "says"),
    [
        ("segments.npy", "flip", True, r"segments\.npy: sha256 .*, index\.json records .* \(damaged file\)"),
        ("cu_seqlens.npy", "flip", True, r"cu_seqlens\.npy: sha256"),
        ("step.npy", "truncate", False, r"step\.npy: \d+ bytes, index\.json records"),
        ("seg_offsets.npy", "truncate", True, r"seg_offsets\.npy: \d+ bytes"),
        (INDEX, "flip", False, r"index\.json: unreadable"),
    ],
)
def test_a_damaged_index_is_named_and_made_again(
    sharded_build: Path, tmp_path: Path, target: str, how: str, verify: bool, says: str
) -> None:
    cache = tmp_path / "cache"
    want = list(
        PackedDataset(sharded_build, world=World(0, 1), balance=Balance(window=2), reading=Reading(cache_dir=cache))
    )
    folder = folder_of(PackedDataset(sharded_build, world=World(0, 1), reading=Reading(cache_dir=cache)), cache)
    damage(folder / target, how)
    with pytest.warns(UserWarning, match=says):
        ds = PackedDataset(
            sharded_build, world=World(0, 1), balance=Balance(window=2), reading=Reading(cache_dir=cache, verify=verify)
        )
    got = list(ds)
    assert len(got) == len(want) and all(same(a, b) for a, b in zip(want, got, strict=True))
    record = json.loads((folder / INDEX).read_text())
    assert all(sha256_file(folder / f"{a}.npy") == record["files"][a]["sha256"] for a in ARRAYS)


def test_an_interrupted_index_is_made_again_without_a_word(sharded_build: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    want = list(PackedDataset(sharded_build, world=World(0, 1), reading=Reading(cache_dir=cache)))
    folder = folder_of(PackedDataset(sharded_build, world=World(0, 1), reading=Reading(cache_dir=cache)), cache)
    (folder / INDEX).unlink()  # what a killed writer leaves, had it written into place (it writes elsewhere)
    (folder / "segments.npy").write_bytes(b"partial")
    killed = folder.parent / f".{folder.name}.999999.tmp"  # what it leaves where it writes
    killed.mkdir()
    (killed / "step.npy").write_bytes(b"partial")
    got = list(PackedDataset(sharded_build, world=World(0, 1), reading=Reading(cache_dir=cache)))
    assert all(same(a, b) for a, b in zip(want, got, strict=True))
    assert (folder / INDEX).exists() and not [p for p in folder.parent.iterdir() if p.name.startswith(".")]


def open_in_child(build: Path, cache: Path) -> None:
    ds = PackedDataset(build, world=World(0, 1), reading=Reading(cache_dir=cache))
    os._exit(0 if ds.shards.index is not None and len(list(ds)) > 0 else 1)


def test_the_index_is_made_once_per_node_and_remade_verified(sharded_build: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    fork = multiprocessing.get_context("fork")
    procs = [fork.Process(target=open_in_child, args=(sharded_build, cache)) for _ in range(3)]
    for p in procs:  # three processes open the build at once: one makes the index, the others wait for it
        p.start()
    for p in procs:
        p.join()
    assert [p.exitcode for p in procs] == [0, 0, 0]
    folder = folder_of(PackedDataset(sharded_build, world=World(0, 1), reading=Reading(cache_dir=cache)), cache)
    made = (folder / INDEX).stat().st_mtime_ns
    assert len(list((cache / "index").glob("*/index.json"))) == 1
    PackedDataset(sharded_build, world=World(0, 1), reading=Reading(cache_dir=cache, verify=False))
    assert (folder / INDEX).stat().st_mtime_ns == made  # mapped as it is, not made again
    shutil.rmtree(cache / "index")
    # made from unverified metadata
    PackedDataset(sharded_build, world=World(0, 1), reading=Reading(cache_dir=cache, verify=False))
    assert json.loads((folder / INDEX).read_text())["meta_verified"] is False
    # a verifying reader does not trust that one
    PackedDataset(sharded_build, world=World(0, 1), reading=Reading(cache_dir=cache))
    assert json.loads((folder / INDEX).read_text())["meta_verified"] is True


def test_a_spawned_worker_maps_the_index_itself(sharded_build: Path, tmp_path: Path) -> None:
    ds = PackedDataset(
        sharded_build, world=World(0, 1), payload=Payload(fields=LEAN), reading=Reading(cache_dir=tmp_path)
    )
    want = list(ds)
    ds.load_state_dict(
        PackedDataset(
            sharded_build, world=World(0, 1), payload=Payload(fields=LEAN), reading=Reading(cache_dir=tmp_path)
        ).state_dict()
    )
    copy = pickle.loads(pickle.dumps(ds))  # what a spawned DataLoader worker receives
    held = {**copy.shards.__dict__, **copy._feed.__dict__, **copy._builder.__dict__}
    assert held["_index"] is None and not held["_open"] and not held["_plain"] and not held["_pool"]
    assert not {"steps", "segments", "seq_tokens"} & set(held)
    cu = table_of(copy).cu
    assert copy.shards.index is not None and mapped(copy.shards.steps) and cu is not None and mapped(cu[0])
    got = list(copy)
    assert len(got) == len(want) and all(same(a, b) for a, b in zip(want, got, strict=True))


def test_the_digest_names_the_build_not_its_folder(sharded_build: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(sharded_build / "shards", copy / "shards")
    a = PackedDataset(sharded_build, world=World(0, 1), reading=Reading(cache_dir=tmp_path / "cache"))
    b = PackedDataset(copy, world=World(0, 1), reading=Reading(cache_dir=tmp_path / "cache"))
    assert a.shards._index_dir == b.shards._index_dir  # one index for every copy of the build on the node
