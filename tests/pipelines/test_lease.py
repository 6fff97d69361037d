"""The lease of an object-store root, on a real ``moto_server`` (through a fault-injecting proxy where the network
fails): one driver at a time, a killed one's lease taken over after its ttl by exactly one contender, a lease
lost while held reported; the fence (a writer that lost the lease publishes nothing more, commit records carry
the generation); renewals that tell a lost lease (removed, taken over) from an unreachable endpoint (retried
until the ttl would expire); and the Dagster storage resource taking the lease of the root a step builds into."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import dagster as dg
import pytest

from contract.fence import fenced
from contract.store import Store
from mixing import load_mix
from mixing.output.commit import commit, read_commit
from pipelines.lease import LEASE_NAME, BuildBusy, LeaseLost, held_lease, root_lease
from pipelines.resources import LeasedStorage, storage_resource
from tests.conftest import S3, S3_BUCKET, TINY_MIX, write_tiny_sources
from tests.faults.proxy import CutMode, FaultProxy

ROOT = Path(__file__).resolve().parents[2]
TTL = 2.0


@pytest.fixture
def proxy(s3: S3) -> Iterator[FaultProxy]:
    with FaultProxy(s3.endpoint) as p:
        yield p


def _via(s3: S3, proxy: FaultProxy) -> dict[str, Any]:
    """Storage options that reach the endpoint through ``proxy``."""
    return {**s3.options, "client_kwargs": {**s3.options["client_kwargs"], "endpoint_url": proxy.url}}


def _lease(s3: S3, store: Store) -> dict[str, Any]:
    """The lease object's body, read past any proxy."""
    key = f"{store.root.partition('/')[2]}/{LEASE_NAME}"
    return dict(json.loads(s3.client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read()))


def _holder(store: Store) -> str:
    return str(json.loads(store.read(LEASE_NAME))["holder"])


def _wait_until(what: str, done: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


def test_a_held_lease_refuses_another_driver_naming_the_holder_and_renews_past_its_ttl(store: Store, s3: S3) -> None:
    said: list[str] = []
    with root_lease(store, wait=False, say=said.append, ttl=TTL) as lease:
        assert lease is not None and f"pid {os.getpid()}" in _holder(store)
        for _ in range(3):  # 3 s > ttl: only renewals keep it
            with pytest.raises(BuildBusy) as e, root_lease(store, wait=False, say=said.append, ttl=TTL):
                pass
            assert f"pid {os.getpid()}" in str(e.value) and "--wait" in str(e.value)
            assert s3.options["secret"] not in str(e.value)
            time.sleep(1.0)
        assert lease.lost is None
    assert not store.exists(LEASE_NAME), "released: removed"
    with root_lease(store, wait=False, say=said.append, ttl=TTL):
        pass
    assert said == []


def test_a_waiting_driver_starts_when_the_holder_releases(store: Store) -> None:
    said: list[str] = []
    held, told, released = threading.Event(), threading.Event(), threading.Event()

    def hold() -> None:
        with root_lease(store, wait=False, say=lambda _s: None, ttl=TTL):
            held.set()
            told.wait(20)  # past the ttl: renewed meanwhile
        released.set()

    def say(line: str) -> None:
        said.append(line)
        told.set()

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    with root_lease(store, wait=True, say=say, ttl=TTL):
        assert released.is_set() and f"pid {os.getpid()}" in _holder(store)
    t.join()
    assert len(said) == 1 and said[0].startswith("waiting for the build of"), said


def test_a_killed_drivers_lease_is_refused_until_its_ttl_then_taken_over(store: Store, s3: S3) -> None:
    code = (
        "import sys, time; from contract.store import Store; from pipelines.lease import root_lease; "
        f"s = Store.open({store.url!r}, {s3.options!r}); "
        f"cm = root_lease(s, wait=False, say=print, ttl={TTL}); cm.__enter__(); "
        "print('held', flush=True); time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        dead = _holder(store)
        os.kill(proc.pid, signal.SIGKILL)  # no release: the object stays
    finally:
        proc.kill()
        proc.wait()
    with pytest.raises(BuildBusy, match="expires"), root_lease(store, wait=False, say=print, ttl=TTL):
        pass
    said: list[str] = []
    with root_lease(store, wait=True, say=said.append, ttl=TTL):
        assert f"pid {os.getpid()}" in _holder(store)
    assert any(s.startswith("took over the lease") and dead in s for s in said), said


def test_of_drivers_taking_over_one_stale_lease_exactly_one_wins_with_a_greater_generation(store: Store) -> None:
    old = 10**12  # greater than any start time in seconds: the winner's generation is this one's next
    store.put(LEASE_NAME, json.dumps({"holder": "gone pid 1", "ttl": 1.0, "generation": old}).encode())
    time.sleep(3.2)  # older than its ttl and the headers' whole second, by the server's clock
    won: list[int] = []
    refused: list[str] = []
    go = threading.Barrier(4)
    release = threading.Event()

    def contend(i: int) -> None:
        go.wait()
        try:
            with root_lease(store, wait=False, say=lambda _s: None, ttl=30) as lease:
                assert lease is not None
                won.append(lease.generation)
                release.wait(10)
        except BuildBusy as e:
            refused.append(str(e))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    _wait_until("all but one refused", lambda: len(refused) == 3 or len(won) > 1)
    release.set()
    for t in threads:
        t.join()
    assert won == [old + 1] and len(refused) == 3, (won, refused)


def test_a_lease_taken_over_while_held_is_reported_naming_the_holder_now(store: Store) -> None:
    with pytest.raises(LeaseLost) as e, root_lease(store, wait=False, say=print, ttl=TTL):
        store.put(LEASE_NAME, json.dumps({"holder": "intruder pid 2", "ttl": 60}).encode())  # an unconditional writer
        time.sleep(TTL)  # the next renewal finds another ETag
    assert "lost the root's lease" in str(e.value) and "another build took it over" in str(e.value)
    assert "held now by intruder pid 2" in str(e.value) and store.url in str(e.value)
    assert "intruder" in _holder(store), "a lost lease is left to its new holder"


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


def test_a_renewal_refused_for_another_reason_loses_the_lease_saying_why(store: Store, s3: S3) -> None:
    iam = boto3.client(
        "iam",
        endpoint_url=s3.endpoint,
        region_name=s3.options["client_kwargs"]["region_name"],
        aws_access_key_id=s3.options["key"],
        aws_secret_access_key=s3.options["secret"],
    )
    key = iam.create_access_key(UserName="weir")["AccessKey"]
    revocable = Store.open(store.url, s3.with_credentials(key["AccessKeyId"], key["SecretAccessKey"]))
    with pytest.raises(LeaseLost) as e, root_lease(revocable, wait=False, say=print, ttl=TTL) as lease:
        assert lease is not None
        iam.delete_access_key(UserName="weir", AccessKeyId=key["AccessKeyId"])
        _wait_until("the renewal is refused", lambda: lease.lost is not None, timeout_s=3 * TTL)
        assert str(lease.lost).startswith("its renewal failed: PermissionError"), lease.lost
    assert "who holds it now is not known" in str(e.value) and key["SecretAccessKey"] not in str(e.value)


@pytest.mark.parametrize("mode", ["refuse", "stall"])
def test_a_renewal_survives_a_connection_error_shorter_than_its_ttl(
    store: Store, s3: S3, proxy: FaultProxy, mode: CutMode
) -> None:
    via = Store.open(store.url, _via(s3, proxy))
    said: list[str] = []
    with root_lease(via, wait=False, say=said.append, ttl=8.0) as lease:  # a beat every 2 s, 2 s per request
        assert lease is not None
        proxy.cut(mode, seconds=4.0)
        time.sleep(4.0)
        beat = _lease(s3, store)["beat"]
        _wait_until("a renewal after the cut", lambda: _lease(s3, store)["beat"] > beat, timeout_s=6.0)
        assert lease.lost is None
        commit(via, "plan", None, [])  # still admitted
    assert any("endpoint unreachable, renewing the lease again" in s for s in said), said
    assert not store.exists(LEASE_NAME) and proxy.connections > 0


def test_an_endpoint_back_after_the_ttl_but_within_the_outage_limit_keeps_the_lease_nobody_took(
    store: Store, s3: S3, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the renewal that lands is conditional on this build's ETag, which a take-over would have changed
    monkeypatch.setenv("WEIR_OUTAGE_S", "30")
    via = Store.open(store.url, _via(s3, proxy))
    with root_lease(via, wait=False, say=print, ttl=TTL) as lease:
        assert lease is not None
        beat = _lease(s3, store)["beat"]
        proxy.cut("refuse")
        time.sleep(TTL + 1.0)
        assert lease.lost is None
        proxy.resume()
        _wait_until("a renewal after the outage", lambda: _lease(s3, store)["beat"] > beat, timeout_s=3 * TTL)
        commit(via, "plan", None, [])  # admitted again
        assert lease.lost is None
    assert store.exists("commits/plan.json") and not store.exists(LEASE_NAME)


def test_an_endpoint_unreachable_past_the_ttl_and_the_outage_limit_loses_the_lease_and_says_why(
    store: Store, s3: S3, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIR_OUTAGE_S", "1")
    via = Store.open(store.url, _via(s3, proxy))
    with pytest.raises(LeaseLost) as e, root_lease(via, wait=False, say=print, ttl=TTL) as lease:
        assert lease is not None
        proxy.cut("refuse")
        _wait_until("the lease lapses", lambda: lease.lost is not None, timeout_s=3 * TTL)
        proxy.resume()
        with pytest.raises(LeaseLost):
            commit(via, "plan", None, [])
    assert "did not answer for its ttl of 2 s and 1 s of outage" in str(e.value)
    assert not store.exists("commits/plan.json")
    assert store.exists(LEASE_NAME), "a lapsed lease is not removed: another build may hold it, or take it over"


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


def test_a_remote_root_without_conditional_writes_builds_without_a_lease_and_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    store = Store(f"memory://{tmp_path.name}")
    with root_lease(store, wait=False, say=said.append) as lease:
        assert lease is None
    assert said and "nothing keeps another build out" in said[0]


def test_a_dagster_step_building_into_an_s3_root_holds_its_lease(
    store: Store, s3: S3, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The storage resource of the definitions: the step's lease taken when it first asks for the layout,
    waiting for another holder's to end, fencing the root while the step runs, released when it ends."""
    write_tiny_sources(tmp_path / "data")
    (tmp_path / "tiny.yaml").write_text(TINY_MIX.format(root=tmp_path / "data"))
    mix = load_mix(tmp_path / "tiny.yaml")
    for name, value in s3.env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("WEIR_LEASE_TTL", str(TTL))
    monkeypatch.setenv("WEIR_WORK_DIR", str(tmp_path / "work"))
    resource = storage_resource(f"s3://{S3_BUCKET}/{store.root.partition('/')[2]}", per_mix=False)
    assert isinstance(resource, LeasedStorage)
    seen: dict[str, Any] = {}

    @dg.asset
    def plan(storage: LeasedStorage) -> None:
        layout = storage.layout(mix)
        root = layout.store()
        seen["lease"] = held_lease(root)
        seen["holder"] = _holder(root)
        seen["record"] = commit(root, "plan", None, [])

    instance = dg.DagsterInstance.ephemeral()

    def step_waits() -> bool:
        logged = [e.user_message for run in instance.get_runs() for e in instance.all_logs(run.run_id)]
        return any(m.startswith("waiting for the build of") for m in logged)

    code = (  # another driver (a process of its own: this process's own lease would be the step's)
        "import sys; from contract.store import Store; from pipelines.lease import root_lease; "
        f"s = Store.open({store.url!r}, {s3.options!r}); "
        f"cm = root_lease(s, wait=False, say=print, ttl={TTL}); cm.__enter__(); "
        "print('held', flush=True); sys.stdin.readline(); cm.__exit__(None, None, None)"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert other.stdin is not None and other.stdout is not None
    done: list[dg.ExecuteInProcessResult] = []
    try:
        assert other.stdout.readline().strip() == "held"
        run = threading.Thread(
            target=lambda: done.append(dg.materialize([plan], resources={"storage": resource}, instance=instance))
        )
        run.start()
        _wait_until("the step waits for the lease", step_waits, timeout_s=60)
        other.stdin.write("release\n")
        other.stdin.flush()
        assert other.wait(30) == 0
        run.join(60)
    finally:
        other.kill()
    assert done and done[0].success
    assert seen["lease"] is not None and f"pid {os.getpid()}" in seen["holder"]
    assert seen["record"].generation == seen["lease"].generation
    assert not store.exists(LEASE_NAME), "released when the step ended"
    assert storage_resource(store.url, per_mix=False, bound=False).layout(mix).target == store.url
    assert not store.exists(LEASE_NAME), "outside a run, nothing is taken"


def test_a_lease_whose_answer_is_lost_is_taken_and_an_endpoint_that_never_answers_is_given_up(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy endpoint that writes the lease but whose answer times out: the build reads the lease back, finds
    its own, and holds it (not "another build holds it", naming itself); one that never answers: the build gives
    up after ``ACQUIRE_TRIES`` requests, naming the endpoint."""
    from fsspec.exceptions import FSTimeoutError

    from pipelines import lease as lease_module

    real, calls = lease_module.put, []

    def answer_lost_once(*args: Any, **kwargs: Any) -> str:
        calls.append(kwargs.get("if_match"))
        etag = real(*args, **kwargs)
        if len(calls) == 1:
            raise FSTimeoutError
        return etag

    monkeypatch.setattr(lease_module, "put", answer_lost_once)
    with root_lease(store, wait=False, say=print, ttl=TTL) as lease:
        assert lease is not None and store.fence() is lease
        written = json.loads(store.read(LEASE_NAME))
        assert written["holder"].endswith(f"pid {os.getpid()}") and written["generation"] == lease.generation
    assert calls[:2] == [None, None] and not store.exists(LEASE_NAME), "taken by its second write, released after"

    def never_answers(*args: Any, **kwargs: Any) -> str:
        calls.append("dead")
        raise FSTimeoutError

    monkeypatch.setattr(lease_module, "put", never_answers)
    monkeypatch.setattr(lease_module, "head", never_answers)
    calls.clear()
    with pytest.raises(lease_module.EndpointUnreachable, match="did not answer"), root_lease(store, False, print, TTL):
        pass
    assert len(calls) == lease_module.ACQUIRE_TRIES
