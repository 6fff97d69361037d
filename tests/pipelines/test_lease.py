"""The lease of an object-store root, on a real ``moto_server``: one driver at a time, a killed one's lease
taken over after its ttl by exactly one contender, a lease lost while held reported."""

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

import pytest

from contract.store import Store
from pipelines.lease import LEASE_NAME, BuildBusy, LeaseLost, root_lease
from tests.conftest import S3, S3_BUCKET, s3_endpoint

ROOT = Path(__file__).resolve().parents[2]
TTL = 2.0


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_endpoint() as s3:
        yield s3


@pytest.fixture
def store(s3: S3, request: pytest.FixtureRequest) -> Store:
    return Store.open(f"s3://{S3_BUCKET}/{request.node.name[:40]}", s3.options)


def _holder(store: Store) -> str:
    return str(json.loads(store.read(LEASE_NAME))["holder"])


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
    assert not store.exists(LEASE_NAME), "released: removed"
    with root_lease(store, wait=False, say=said.append, ttl=TTL):
        pass
    assert said == []


def test_a_waiting_driver_starts_when_the_holder_releases(store: Store) -> None:
    said: list[str] = []
    held = threading.Event()

    def hold() -> None:
        with root_lease(store, wait=False, say=lambda _s: None, ttl=TTL):
            held.set()
            time.sleep(1.5)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    start = time.monotonic()
    with root_lease(store, wait=True, say=said.append, ttl=TTL):
        waited = time.monotonic() - start
    t.join()
    assert 0.5 < waited < 6 and any(s.startswith("waiting for the build of") for s in said), said


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
    start = time.monotonic()
    with root_lease(store, wait=True, say=said.append, ttl=TTL):
        assert f"pid {os.getpid()}" in _holder(store)
    assert time.monotonic() - start < TTL + 4
    assert any(s.startswith("took over the lease") and dead in s for s in said), said


def test_of_drivers_taking_over_one_stale_lease_exactly_one_wins(store: Store) -> None:
    store.put(LEASE_NAME, json.dumps({"holder": "gone pid 1", "ttl": 1.0}).encode())
    time.sleep(2.2)  # older than its ttl by the server's clock (whole seconds)
    won: list[str] = []
    refused: list[str] = []
    go = threading.Barrier(4)
    release = threading.Event()

    def contend(i: int) -> None:
        go.wait()
        try:
            with root_lease(store, wait=False, say=lambda _s: None, ttl=30):
                won.append(_holder(store))
                release.wait(10)
        except BuildBusy as e:
            refused.append(str(e))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while len(won) + len(refused) < 4 and time.monotonic() < deadline:
        if len(refused) == 3:
            break
        time.sleep(0.05)
    release.set()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(refused) == 3, (won, refused)


def test_a_lease_taken_over_while_held_is_reported_when_the_build_ends(store: Store) -> None:
    with pytest.raises(LeaseLost, match="lost its lease"), root_lease(store, wait=False, say=print, ttl=TTL):
        store.put(LEASE_NAME, json.dumps({"holder": "intruder pid 2", "ttl": 60}).encode())  # an unconditional writer
        time.sleep(TTL)  # the next renewal finds another ETag
    assert "intruder" in _holder(store), "a lost lease is left to its new holder"


def test_a_remote_root_without_conditional_writes_builds_without_a_lease_and_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    store = Store(f"memory://{tmp_path.name}")
    with root_lease(store, wait=False, say=said.append) as lease:
        assert lease is None
    assert said and "nothing keeps another build out" in said[0]
