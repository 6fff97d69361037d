"""s3:// builds: a real local S3 endpoint (moto_server), the same stream as the local build, a bounded cache."""

from __future__ import annotations

import gc
import os
import re
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.shards import ShardError
from loaders import Balance, PackedDataset, PackedLoader, Payload, Reading, World
from loaders.remote import RemoteShardSet
from tests.conftest import moto_endpoint


@pytest.fixture(scope="module")
def s3() -> Iterator[dict]:
    s3fs = pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    with moto_endpoint() as endpoint:
        opts = {
            "key": "test",
            "secret": "test",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        boto3.client(
            "s3", endpoint_url=endpoint, aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
        ).create_bucket(Bucket="weir-test")
        yield {"fs": s3fs.S3FileSystem(**opts), "opts": opts}


def test_s3_stream_equals_the_local_stream_within_the_cache_bound(
    s3: dict, sharded_build: Path, tmp_path: Path
) -> None:
    s3["fs"].put(str(sharded_build / "shards"), "weir-test/tiny/shards", recursive=True)
    local = PackedDataset(sharded_build, world=World(1, 2, 0, 2), balance=Balance(seed=4, window=3))
    shards = local.shards.manifest.shards
    assert len(shards) >= 3, "the shard size override no longer works, so eviction would not be exercised"
    one = max(sum(f.bytes for f in s.files.both()) for s in shards)
    remote = PackedDataset(
        "s3://weir-test/tiny",
        world=World(1, 2, 0, 2),
        balance=Balance(seed=4, window=3),
        reading=Reading(cache_dir=tmp_path, cache_bytes=2 * one, storage_options=s3["opts"]),
    )
    assert remote.build_id == local.build_id
    assert isinstance(remote.shards, RemoteShardSet)
    peak = 0
    for a, b in zip(local, remote, strict=True):
        assert a["sequence"] == b["sequence"] and all(a[k].equal(b[k]) for k in ("input_ids", "labels", "indices"))
        peak = max(peak, remote.shards.cached_bytes())
        on_disk = sum(p.stat().st_size for p in tmp_path.rglob("shard-*"))
        assert on_disk <= 2 * one
    assert 0 < peak <= 2 * one


def test_s3_missing_build_is_a_clear_error(s3: dict) -> None:
    with pytest.raises(Exception, match=r"no manifest\.json"):
        PackedDataset("s3://weir-test/nothing", world=World(0, 1), reading=Reading(storage_options=s3["opts"]))


def test_s3_workers_and_restarts_share_the_nodes_cache(s3: dict, sharded_build: Path, tmp_path: Path) -> None:
    """Two DataLoader workers and then a second pass (a restart) read one copy of each shard: the cache holds the
    build's shard bytes once, and the second pass downloads nothing (every cached file is the same inode)."""
    s3["fs"].put(str(sharded_build / "shards"), "weir-test/tiny2/shards", recursive=True)
    local = [i["sequence"] for i in PackedDataset(sharded_build, world=World(0, 2), balance=Balance(seed=1))]
    remote = PackedDataset(
        "s3://weir-test/tiny2",
        world=World(0, 2),
        balance=Balance(seed=1),
        reading=Reading(cache_dir=tmp_path, storage_options=s3["opts"]),
    )
    got = [i["sequence"] for i in PackedLoader(remote, num_workers=2)]
    assert got == local
    (folder,) = [p for p in tmp_path.iterdir() if (p / "manifest.json").exists()]
    files = {p.name: p.stat() for p in folder.glob("shard-*")}
    build_bytes = sum(f.bytes for s in remote.shards.manifest.shards for f in s.files.both())
    assert isinstance(remote.shards, RemoteShardSet)
    assert sum(st.st_size for st in files.values()) == build_bytes == remote.shards.cached_bytes()
    again = PackedDataset(
        "s3://weir-test/tiny2",
        world=World(0, 2),
        balance=Balance(seed=1),
        reading=Reading(cache_dir=tmp_path, storage_options=s3["opts"]),
    )
    assert [i["sequence"] for i in PackedLoader(again, num_workers=2)] == local
    assert {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.glob("shard-*")} == {
        n: (st.st_ino, st.st_mtime_ns) for n, st in files.items()
    }


def test_s3_damaged_object_or_cached_file_is_named_before_its_tokens(
    s3: dict, sharded_build: Path, tmp_path: Path
) -> None:
    from loaders.integrity import CorruptShardError
    from tests.loaders.test_integrity import DAMAGED, copy_shards, flip_bit, shard_file

    root = copy_shards(sharded_build, tmp_path / "damaged")
    flip_bit(shard_file(root, DAMAGED, "tokens.npy"))
    s3["fs"].put(str(root / "shards"), "weir-test/damaged/shards", recursive=True)
    reading = Reading(cache_dir=tmp_path / "c1", storage_options=s3["opts"])
    with pytest.raises(
        CorruptShardError, match=rf"s3://weir-test/damaged/shards/shard-0000{DAMAGED}\.tokens\.npy: sha256"
    ):
        damaged = PackedDataset("s3://weir-test/damaged", world=World(0, 1), payload=Payload(chunk=4), reading=reading)
        list(PackedLoader(damaged, num_workers=2))
    # a sound bucket, but a damaged file of the right size already in this process's cache folder
    s3["fs"].put(str(sharded_build / "shards"), "weir-test/sound/shards", recursive=True)
    ds = PackedDataset(
        "s3://weir-test/sound",
        world=World(0, 1),
        reading=Reading(cache_dir=tmp_path / "c2", storage_options=s3["opts"]),
    )
    stale = ds.shards.dir / shard_file(root, DAMAGED, "tokens.npy").name
    stale.write_bytes(shard_file(root, DAMAGED, "tokens.npy").read_bytes())
    seen = []
    with pytest.raises(CorruptShardError, match=re.escape(str(stale)) + ": sha256"):
        for item in ds:
            seen.append(item["sequence"])
    assert len(seen) == 8 * DAMAGED  # every item before that shard, none of it


def test_an_unreachable_store_is_one_line_naming_the_build(sharded_build: Path, tmp_path: Path) -> None:
    """Nothing listens at the endpoint: the loader retries for outage_s, then says so in one line."""
    pytest.importorskip("s3fs")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # free, and nothing will listen there
    opts = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}"}}
    opts |= {"config_kwargs": {"retries": {"max_attempts": 1}, "connect_timeout": 1}}
    t = time.monotonic()
    with pytest.raises(ShardError) as e:
        PackedDataset(
            "s3://weir-test/gone",
            world=World(0, 1),
            reading=Reading(cache_dir=tmp_path, storage_options=opts, outage_s=1),
        )
    assert "s3://weir-test/gone: unreachable for 1 s" in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - t < 30


def test_a_full_cache_disk_names_cache_dir_and_cache_bytes(s3: dict, sharded_build: Path, tmp_path: Path) -> None:
    """The cache on a small tmpfs, filled once the dataset is open: the first fetch fails naming where and what
    to change."""
    small = tmp_path / "small"
    small.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(small)], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        s3["fs"].put(str(sharded_build / "shards"), "weir-test/full/shards", recursive=True)
        reading = Reading(cache_dir=small, storage_options=s3["opts"])
        PackedDataset("s3://weir-test/full", world=World(0, 1), reading=reading)  # its manifest and index fit
        for p in small.rglob("shard-*"):
            p.unlink()  # the shards it fetched to open: fetched again below
        free = os.statvfs(small)
        (small / "filler").write_bytes(b"\0" * (free.f_bavail * free.f_frsize))
        with pytest.raises(ShardError, match=r"the disk is full while caching .*cache_bytes"):
            list(PackedDataset("s3://weir-test/full", world=World(0, 1), reading=reading))
    finally:
        gc.collect()
        subprocess.run(["umount", "-l", str(small)], check=False)
