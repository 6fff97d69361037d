"""Faults of builds into an object-store root, with real ``weir build`` processes, a real ``moto_server`` and a
fault-injecting TCP proxy in front of it (``tests/faults/proxy.py``):

- a build stopped (SIGSTOP) past its lease's ttl while another build takes the lease over and completes: continued,
  it is refused its next write, publishes nothing, and fails with one ``build failed:`` line; the other's build
  stays whole;
- an endpoint outage shorter than ``WEIR_OUTAGE_S``: the build waits it out, says so, and completes;
- a longer one: one ``build failed:`` line naming the root, no traceback, exit code 1, the lease left to expire.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from contract.manifest import MANIFEST
from contract.shards import ShardSet
from contract.store import Store
from mixing.output.commit import Commit, committed, read_commit, verify
from pipelines.lease import LEASE_NAME
from tests.conftest import S3, S3_BUCKET, TINY_MIX, s3_endpoint, write_tiny_sources
from tests.faults.proxy import FaultProxy

ROOT = Path(__file__).resolve().parents[2]
WEIR = [sys.executable, "-m", "pipelines.cli", "build"]


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_endpoint() as s3:
        yield s3


@pytest.fixture(scope="module")
def mix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("mix")
    write_tiny_sources(base / "data")
    (base / "tiny.yaml").write_text(TINY_MIX.format(root=base / "data"))
    return base / "tiny.yaml"


class Build:
    """``weir build MIX --out URL`` in a subprocess with its own working folder (a driver on a machine of its
    own), stdout and stderr in files."""

    def __init__(self, mix: Path, url: str, env: dict[str, str], folder: Path, *flags: str) -> None:
        folder.mkdir(parents=True)
        self.out, self.err = folder / "stdout", folder / "stderr"
        full = {**os.environ, "PYTHONUNBUFFERED": "1", "WEIR_WORK_DIR": str(folder / "work"), **env}
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                [*WEIR, str(mix), "--out", url, *flags], cwd=ROOT, env=full, stdout=out, stderr=err, text=True
            )

    def wait(self, timeout_s: float = 300) -> int:
        try:
            return self.proc.wait(timeout_s)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def output(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def failed_lines(self) -> list[str]:
        return [line for line in self.err.read_text().splitlines() if line.startswith("build failed")]


def _own_tracebacks(text: str) -> list[str]:
    """The tracebacks in ``text``, less SQLAlchemy's pool finalizer's ("Exception during reset or similar"): it
    reports a Dagster throwaway instance's SQLite connection collected on another thread, and says nothing
    about the build."""
    blocks = re.split(r"(?=Traceback \(most recent call last\))", text)[1:]
    return [b for b in blocks if "sqlalchemy/pool/" not in b.split("\n\n")[0]]


def _objects(s3: S3, prefix: str) -> dict[str, tuple[str, Any]]:
    """Every object under ``prefix``: key → (ETag, LastModified), read straight from the endpoint."""
    found: dict[str, tuple[str, Any]] = {}
    for page in s3.client.get_paginator("list_objects_v2").paginate(Bucket=S3_BUCKET, Prefix=f"{prefix}/"):
        for o in page.get("Contents", []):
            found[o["Key"]] = (o["ETag"], o["LastModified"])
    return found


def _until(what: str, done: Callable[[], bool], build: Build, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert build.proc.poll() is None, f"the build ended before {what}:\n{build.output()[-3000:]}"
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


def _whole(store: Store) -> None:
    """Every commit record of ``store`` reads back and its files are as listed; the manifest's shards too."""
    records = committed(store)
    assert records and all(isinstance(c, Commit) for c in records), records
    for c in records:
        assert isinstance(c, Commit) and verify(store, c) == [], c
    assert ShardSet(f"{store.url}/shards", store.storage_options).file_problems() == {}


def test_a_stopped_build_loses_its_lease_publishes_nothing_and_the_other_build_stays_whole(
    s3: S3, mix: Path, tmp_path: Path
) -> None:
    url, prefix = f"s3://{S3_BUCKET}/paused", "paused"
    store = Store.open(url, s3.options)
    env = {**s3.env(), "WEIR_LEASE_TTL": "3"}
    a = Build(mix, url, env, tmp_path / "a")
    _until("A commits its length stats", lambda: f"{prefix}/commits/length_stats.json" in _objects(s3, prefix), a)
    os.kill(a.proc.pid, signal.SIGSTOP)
    try:
        stale = read_commit(store, "length_stats", None)
        b = Build(mix, url, env, tmp_path / "b", "--wait")
        assert b.wait() == 0, b.output()[-3000:]
        assert "took over the lease of" in b.output()
        before = _objects(s3, prefix)
        manifest = store.read(f"shards/{MANIFEST}")
    finally:
        os.kill(a.proc.pid, signal.SIGCONT)
    assert a.wait(120) == 1, a.output()[-3000:]
    failed = a.failed_lines()
    assert len(failed) == 1, a.err.read_text()
    assert "LeaseLost" in failed[0] and url in failed[0] and "lost the root's lease" in failed[0]
    assert "no build holds it now" in failed[0] and "build again" in failed[0]
    assert _own_tracebacks(a.output()) == [] and s3.options["secret"] not in a.output()
    assert _objects(s3, prefix) == before, "the stopped build wrote nothing after it was continued"
    assert store.read(f"shards/{MANIFEST}") == manifest
    _whole(store)
    record = read_commit(store, "packed_shards", None)
    assert stale is not None and stale.generation is not None
    assert record is not None and record.generation is not None and record.generation > stale.generation
    assert not store.exists(LEASE_NAME)


def test_an_outage_shorter_than_the_limit_is_waited_out_and_said(s3: S3, mix: Path, tmp_path: Path) -> None:
    url, prefix = f"s3://{S3_BUCKET}/short", "short"
    with FaultProxy(s3.endpoint) as proxy:
        env = {**s3.env(), "AWS_ENDPOINT_URL": proxy.url, "WEIR_OUTAGE_S": "30", "WEIR_LEASE_TTL": "20"}
        build = Build(mix, url, env, tmp_path / "build")
        _until("the tokenizer is committed", lambda: f"{prefix}/commits/tokenizer.json" in _objects(s3, prefix), build)
        proxy.cut("refuse", seconds=5)
        assert build.wait() == 0, build.output()[-3000:]
    out = build.output()
    assert "endpoint unreachable" in out and "retrying for up to 30 s" in out, out[-3000:]
    assert build.failed_lines() == [] and _own_tracebacks(out) == []
    store = Store.open(url, s3.options)
    _whole(store)
    assert not store.exists(LEASE_NAME)


def test_an_outage_longer_than_the_limit_ends_in_one_line_and_leaves_the_lease_to_expire(
    s3: S3, mix: Path, tmp_path: Path
) -> None:
    url, prefix = f"s3://{S3_BUCKET}/long", "long"
    with FaultProxy(s3.endpoint) as proxy:
        env = {**s3.env(), "AWS_ENDPOINT_URL": proxy.url, "WEIR_OUTAGE_S": "2", "WEIR_LEASE_TTL": "20"}
        build = Build(mix, url, env, tmp_path / "build")
        _until("the tokenizer is committed", lambda: f"{prefix}/commits/tokenizer.json" in _objects(s3, prefix), build)
        proxy.cut("refuse")
        code = build.wait(240)
    out = build.output()
    assert code == 1, out[-3000:]
    failed = build.failed_lines()
    assert len(failed) == 1, build.err.read_text()
    assert "EndpointUnreachable" in failed[0] and f"build root {url}:" in failed[0], failed[0]
    assert "did not answer within 2 s" in failed[0] and "WEIR_OUTAGE_S" in failed[0]
    assert "its lease is left to expire 20 s after its last renewal" in failed[0]
    assert _own_tracebacks(out) == [], _own_tracebacks(out)
    assert s3.options["secret"] not in out and "retrying for up to 2 s" in out
    store = Store.open(url, s3.options)
    assert json.loads(store.read(LEASE_NAME))["ttl"] == 20, "left to expire, as said"
    for c in committed(store):  # the stage in progress committed nothing half-written
        assert isinstance(c, Commit) and verify(store, c) == [], c
