"""Damaged shard files of a real build (one flipped bit, a truncated or grown file) are named before any of
their tokens is yielded, on every read path; sound files give the very items of an unverified reader."""

from __future__ import annotations

import fcntl
import hashlib
import itertools
import os
import re
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from contract.index import ARRAYS
from contract.manifest import ShardFile
from loaders import PackedDataset, PackedLoader, Payload, Reading, World
from loaders.integrity import CorruptShardError, Verifier

DAMAGED = 2  # the shard whose file is damaged: two sound shards come before it


def copy_shards(build: Path, dest: Path) -> Path:
    """A private copy of ``build``'s shards (the damage must not reach the session's build)."""
    shutil.copytree(build / "shards", dest / "shards")
    return dest


def flip_bit(path: Path, at: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if at is None else at] ^= 0x10
    path.write_bytes(bytes(data))


def shard_file(root: Path, k: int, kind: str) -> Path:
    return root / "shards" / f"shard-{k:05d}.{kind}"


def read_path(ds: PackedDataset, how: str) -> Any:
    """The items of ``ds`` by one of the read paths: chunks (local), one item at a time (what a remote
    build uses), or PackedLoader workers."""
    if how == "chunk":
        return iter(ds)
    if how == "item":
        return (ds.item(i) for i in ds.rank_sequences())
    return iter(PackedLoader(ds, num_workers=2))


@pytest.mark.parametrize("how", ["chunk", "item", "workers"])
@pytest.mark.parametrize("kind", ["tokens.npy", "meta.npz"])
def test_a_flipped_bit_is_named_before_any_token_of_its_file(
    sharded_build: Path, tmp_path: Path, kind: str, how: str
) -> None:
    root = copy_shards(sharded_build, tmp_path)
    bad = shard_file(root, DAMAGED, kind)
    flip_bit(bad)
    first = PackedDataset(sharded_build, world=World(0, 1), reading=Reading(verify=False)).shards.manifest.shards[
        DAMAGED
    ]
    damaged = range(first.first_sequence, first.first_sequence + first.sequences)
    seen: list[int] = []
    with pytest.raises(CorruptShardError, match=re.escape(str(bad)) + ".*sha256") as err:
        ds = PackedDataset(
            root, world=World(0, 1), payload=Payload(chunk=4), reading=Reading(cache_dir=tmp_path / "cache")
        )
        for item in read_path(ds, how):
            seen.append(item["sequence"])
    assert "\n" not in str(err.value)  # one line, also when it comes from a worker
    assert not set(seen) & set(damaged)  # not one item of the damaged shard
    if kind == "tokens.npy":  # the sound shards before it were read (a chunk of 4 may stop short)
        assert len(seen) >= 8 * DAMAGED - 4
    # (a meta file fails when the dataset opens: the planner reads every shard's segments and steps)


@pytest.mark.parametrize("change", ["truncated", "grown"])
def test_a_shard_file_of_another_size_is_named(sharded_build: Path, tmp_path: Path, change: str) -> None:
    root = copy_shards(sharded_build, tmp_path)
    bad = shard_file(root, DAMAGED, "tokens.npy")
    data = bad.read_bytes()
    bad.write_bytes(data[:-100] if change == "truncated" else data + b"\0")
    with pytest.raises(CorruptShardError, match=re.escape(str(bad)) + r": \d+ bytes, the manifest records \d+"):
        list(PackedDataset(root, world=World(0, 1), reading=Reading(cache_dir=tmp_path / "cache")))


@pytest.mark.parametrize("how", ["chunk", "item"])
def test_sound_files_give_the_items_of_an_unverified_reader(sharded_build: Path, tmp_path: Path, how: str) -> None:
    def items(reading: Reading) -> list[dict[str, Any]]:
        ds = PackedDataset(sharded_build, world=World(1, 2, 1, 2), payload=Payload(chunk=3), reading=reading)
        return list(read_path(ds, how))

    verified, plain = items(Reading(cache_dir=tmp_path)), items(Reading(verify=False))
    assert len(verified) == len(plain) > 0
    for a, b in zip(verified, plain, strict=True):
        assert a.keys() == b.keys()
        assert all(a[k].equal(b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)
    n_files = 2 * len(PackedDataset(sharded_build, reading=Reading(verify=False)).shards.manifest.shards) + len(ARRAYS)
    assert len(list((tmp_path / "verified").iterdir())) == n_files  # each file's verdict kept (shards, index)


def test_a_verdict_kept_on_the_node_does_not_hide_a_later_change(sharded_build: Path, tmp_path: Path) -> None:
    root = copy_shards(sharded_build, tmp_path)
    cache = tmp_path / "cache"
    expected = [
        it["sequence"] for it in PackedDataset(root, world=World(0, 1), reading=Reading(cache_dir=cache))
    ]  # all verified, kept
    assert [
        it["sequence"] for it in PackedDataset(root, world=World(0, 1), reading=Reading(cache_dir=cache))
    ] == expected
    bad = shard_file(root, DAMAGED, "tokens.npy")
    mtime = bad.stat().st_mtime_ns
    flip_bit(bad)
    os.utime(bad, ns=(mtime + 10**9, mtime + 10**9))  # a rewrite shows in its mtime (whatever the clock's grain)
    with pytest.raises(CorruptShardError, match=re.escape(str(bad))):
        list(PackedDataset(root, world=World(0, 1), reading=Reading(cache_dir=cache)))


def test_verify_false_is_the_explicit_opt_out(sharded_build: Path, tmp_path: Path) -> None:
    root = copy_shards(sharded_build, tmp_path)
    flip_bit(shard_file(root, DAMAGED, "tokens.npy"))
    sound = list(
        itertools.chain.from_iterable(
            it["input_ids"].tolist() for it in PackedDataset(sharded_build, world=World(0, 1))
        )
    )
    served = list(
        itertools.chain.from_iterable(
            it["input_ids"].tolist() for it in PackedDataset(root, world=World(0, 1), reading=Reading(verify=False))
        )
    )
    assert sum(a != b for a, b in zip(sound, served, strict=True)) == 1  # trusted as asked: one token differs


def test_a_node_verdict_being_written_holds_back_another_thread_of_the_same_process(tmp_path: Path) -> None:
    """The node's verdict marker is locked per open file (flock): a POSIX record lock belongs to the process,
    so a thread of the same process would not wait for it, and the kernel's deadlock detection misfires
    between threads (EDEADLK, seen in a DataLoader worker)."""
    data = tmp_path / "tokens.npy"
    data.write_bytes(os.urandom(4096))
    f = ShardFile(name=data.name, bytes=4096, sha256=hashlib.sha256(data.read_bytes()).hexdigest())
    Verifier(tmp_path / "cache").verify(data, f)  # writes the node's verdict
    (marker,) = (tmp_path / "cache" / "verified").iterdir()
    done = threading.Event()

    def verify_then_say() -> None:
        Verifier(tmp_path / "cache").verify(data, f)
        done.set()

    thread = threading.Thread(target=verify_then_say)
    with open(marker, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        thread.start()
        assert not done.wait(0.5), "verify read the verdict while another holder had it locked"
    thread.join(10)
    assert done.is_set()
