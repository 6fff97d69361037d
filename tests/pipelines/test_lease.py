"""``pipelines/lease.py``: the lease of an object-store root, on a real ``moto_server``: one driver at a time (a
held lease renewed past its ttl, another driver refused or waiting until it is released), a killed one's lease
taken over after its ttl by exactly one contender, a lease taken over while held reported, a lease whose answer
was lost still taken and an endpoint that never answers given up; a root without conditional writes built
without one.

The fence is tested in ``test_lease_fence.py``, renewals through outages in ``test_lease_renewal.py``, the
Dagster storage resource in ``test_lease_dagster.py``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from contract.store import Store
from pipelines.lease import LEASE_NAME, BuildBusy, LeaseLost, root_lease
from tests.conftest import S3
from tests.pipelines.lease_helpers import ROOT, TTL
from tests.pipelines.lease_helpers import holder as _holder
from tests.pipelines.lease_helpers import wait_until as _wait_until


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
    assert _unridden(said) == [], said


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
    rest = _unridden(said)
    assert len(rest) == 1 and rest[0].startswith("waiting for the build of"), said


def _unridden(said: list[str]) -> list[str]:
    """``said`` less a renewal that timed out on a loaded machine (a 2 s ttl: sub-second timeouts against the
    local S3 server) and was ridden out: said as such, then "renewed again" (tests/faults cover outages)."""
    ridden = [s for s in said if "endpoint unreachable, renewing the lease again" in s or s.endswith("renewed again")]
    assert len(ridden) % 2 == 0, f"an outage not ridden out: {said}"
    return [s for s in said if s not in ridden]


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


def test_a_remote_root_without_conditional_writes_builds_without_a_lease_and_says_so(tmp_path: Path) -> None:
    said: list[str] = []
    store = Store(f"memory://{tmp_path.name}")
    with root_lease(store, wait=False, say=said.append) as lease:
        assert lease is None
    assert said and "nothing keeps another build out" in said[0]


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
