"""``pipelines/lease.py``: the fence, on a real ``moto_server``: a build whose lease object was removed, or whose
lease another driver took over while it was paused (a real process, stopped past the ttl), publishes nothing
more, not even a shard; commit records written under the lease carry its generation; every write and removal
under a fenced root, by any :class:`~contract.store.Store` of it, is admitted first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from contract.fence import fenced
from contract.store import Store
from mixing.output.commit import commit, read_commit
from pipelines.lease import LEASE_NAME, LeaseLost, root_lease
from tests.conftest import S3, S3_BUCKET
from tests.pipelines.lease_helpers import ROOT, TTL
from tests.pipelines.lease_helpers import wait_until as _wait_until


def test_the_lease_object_removed_is_lost_at_once_and_nothing_more_is_published(store: Store, s3: S3) -> None:
    with pytest.raises(LeaseLost) as e, root_lease(store, wait=False, say=print, ttl=4.0) as lease:
        assert lease is not None
        commit(store, "plan", None, [])
        s3.client.delete_object(Bucket=S3_BUCKET, Key=f"{store.root.partition('/')[2]}/{LEASE_NAME}")
        _wait_until("the renewal finds it removed", lambda: lease.lost is not None, timeout_s=4.0)  # one beat: 1 s
        assert lease.lost == "its object was removed"
        with pytest.raises(LeaseLost):
            commit(store, "length_stats", None, [])
        with pytest.raises(LeaseLost):
            store.put("shards/shard-00000.tokens.npy", b"stale")  # not a publish point, refused all the same
        with pytest.raises(LeaseLost):
            store.remove("commits/plan.json")
    assert "no build holds it now" in str(e.value)
    assert store.names("commits") == ["plan.json"] and not store.exists("shards/shard-00000.tokens.npy")
    assert not store.exists(LEASE_NAME), "nothing re-creates a removed lease"


def test_commit_records_in_a_fenced_root_carry_the_lease_generation(store: Store) -> None:
    with root_lease(store, wait=False, say=print, ttl=TTL) as lease:
        assert lease is not None and store.fence() is lease and store.sub("shards").fence() is lease
        written = commit(store, "plan", None, [{"name": "plan/x.parquet", "bytes": 1, "sha256": "a" * 64}])
    assert store.fence() is None, "unfenced once released"
    read = read_commit(store, "plan", None)
    assert read == written and read is not None and read.generation == lease.generation
    assert json.loads(store.read("commits/plan.json"))["generation"] == lease.generation
    commit(store, "tokenizer", None, [])
    assert (got := read_commit(store, "tokenizer", None)) is not None and got.generation is None, "unfenced: none"


_WRITER = """
import sys
from contract.store import Store
from contract.errors import WeirError
from mixing.output.commit import commit
from pipelines.lease import root_lease
store = Store.open(sys.argv[1], eval(sys.argv[2]))
with root_lease(store, wait=False, say=print, ttl=float(sys.argv[3])) as lease:
    print("generation", lease.generation, flush=True)
    for line in sys.stdin:
        name = line.strip()
        try:
            store.put(f"shards/{name}.bin", name.encode())
            commit(store, "packed_shards", None, [{"name": f"shards/{name}.bin", "bytes": len(name), "sha256": "0"}])
        except WeirError as e:
            print("refused:", e, flush=True)
            sys.exit(1)
        print("wrote", name, flush=True)
"""


def test_a_paused_writer_publishes_nothing_after_another_took_over(store: Store, s3: S3) -> None:
    """A real process holding the lease is stopped (SIGSTOP) past the ttl; another driver takes the lease over,
    publishes and releases; the stopped one, continued, is refused its next write and leaves the root as is."""
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, store.url, repr(s3.options), str(TTL)],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdin is not None and writer.stdout is not None
    try:
        stale = int(writer.stdout.readline().split()[1])
        writer.stdin.write("first\n")
        writer.stdin.flush()
        assert writer.stdout.readline().strip() == "wrote first"
        os.kill(writer.pid, signal.SIGSTOP)  # idle: between two writes
        said: list[str] = []
        with root_lease(store, wait=True, say=said.append, ttl=TTL) as lease:
            assert lease is not None and lease.generation > stale
            store.put("shards/second.bin", b"second")
            commit(store, "packed_shards", None, [{"name": "shards/second.bin", "bytes": 6, "sha256": "0"}])
        assert any(s.startswith("took over the lease") for s in said), said
        before = {o["Key"]: o["ETag"] for o in s3.client.list_objects_v2(Bucket=S3_BUCKET)["Contents"]}
        os.kill(writer.pid, signal.SIGCONT)
        writer.stdin.write("third\n")
        writer.stdin.flush()
        out, _ = writer.communicate(timeout=30)
    finally:
        writer.kill()
    assert writer.returncode == 1
    lines = out.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("refused: ") and "lost the root's lease" in lines[0], out
    assert "no build holds it now" in lines[0] and store.url in lines[0]
    after = {o["Key"]: o["ETag"] for o in s3.client.list_objects_v2(Bucket=S3_BUCKET)["Contents"]}
    assert after == before, "the stale writer wrote nothing, not even a shard"
    record = read_commit(store, "packed_shards", None)
    assert record is not None and record.generation == lease.generation and "shards/second.bin" in record.files


class _Recording:
    """A fence that records what it is asked and refuses names starting with ``no``."""

    generation = 7

    def __init__(self) -> None:
        self.asked: list[str] = []

    def admit(self, name: str) -> None:
        self.asked.append(name)
        if name.rsplit("/", 1)[-1].startswith("no"):
            raise LeaseLost(f"refused {name}")


def test_the_fence_admits_every_write_and_removal_under_its_root_by_any_store(tmp_path: Path) -> None:
    root = Store(f"memory://fenced-{tmp_path.name}")
    fence = _Recording()
    with fenced(root, fence):
        root.put("commits/plan.json", b"{}")
        root.sub("shards").put("shard-00000.tokens.npy", b"x")
        root.remove("commits/plan.json")
        root.remove_tree("sources")
        with pytest.raises(LeaseLost):
            root.sub("shards").put("no.bin", b"refused")
        assert root.sub("shards").fence() is fence
        Store(f"memory://elsewhere-{tmp_path.name}").put("a", b"not fenced")
    root.put("after", b"not fenced")
    assert fence.asked == [
        "commits/plan.json",
        "shards/shard-00000.tokens.npy",
        "commits/plan.json",
        "sources",
        "shards/no.bin",
    ]
    assert root.names("shards") == ["shard-00000.tokens.npy"], "a refused write leaves nothing, not even a temp file"
    assert root.fence() is None
