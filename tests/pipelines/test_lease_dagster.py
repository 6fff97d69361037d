"""``pipelines/lease.py`` in a Dagster run, on a real ``moto_server``: the storage resource of the definitions
takes the lease of the ``s3://`` root a step builds into, waiting for another driver's to end, fences the root
while the step runs and releases it when the step ends."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from contract.store import Store
from mixing import load_mix
from mixing.output.commit import commit
from pipelines.lease import LEASE_NAME, held_lease
from pipelines.resources import LeasedStorage, storage_resource
from tests.conftest import S3, S3_BUCKET, TINY_MIX, write_tiny_sources
from tests.pipelines.lease_helpers import ROOT, TTL
from tests.pipelines.lease_helpers import holder as _holder
from tests.pipelines.lease_helpers import wait_until as _wait_until


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
