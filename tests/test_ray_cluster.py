"""The test support for real Ray clusters (tests/ray_cluster.py): two nodes on 127.0.0.1 running tasks, a worker
killed mid-task and the task retried, a driver in a subprocess, and nothing left running after the cluster."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ray_cluster import LOOPBACK, LocalRayCluster

ray = pytest.importorskip("ray", reason="ray is not installed (the Ray engine's tests need a real Ray cluster)")

LOOPBACK_LISTEN = {LOOPBACK, f"::ffff:{LOOPBACK}"}  # an IPv6 socket bound to 127.0.0.1 reads as ::ffff:127.0.0.1


def test_two_nodes_on_loopback_each_run_tasks(ray_cluster: LocalRayCluster) -> None:
    import psutil
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    assert ray_cluster.address.startswith(f"{LOOPBACK}:")
    listening = {
        conn.laddr.ip
        for proc in ray_cluster.processes()
        for conn in proc.net_connections(kind="inet")
        if conn.status == psutil.CONN_LISTEN
    }
    assert listening and listening <= LOOPBACK_LISTEN, f"Ray listens beyond {LOOPBACK}: {listening}"

    @ray.remote(num_cpus=1)
    def where() -> str:
        return str(ray.get_runtime_context().get_node_id())

    with ray_cluster.connect():
        nodes = [n for n in ray.nodes() if n["Alive"]]
        assert [n["NodeManagerAddress"] for n in nodes] == [LOOPBACK, LOOPBACK]
        assert all(n["Resources"]["CPU"] == 1 for n in nodes)
        ids = [n["NodeID"] for n in nodes]
        on = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(i, soft=False)).remote() for i in ids]
        assert ray.get(on, timeout=60) == ids


def _wait_for(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout} s"
        time.sleep(0.02)


def test_task_whose_worker_is_killed_is_retried(ray_cluster: LocalRayCluster, tmp_path: Path) -> None:
    marker = tmp_path / "attempts"

    @ray.remote(num_cpus=1, max_retries=3)
    def slow_double(x: int, marker: str) -> int:
        with open(marker, "a") as f:  # one line per attempt: the pid of the worker that made it
            f.write(f"{os.getpid()}\n")
        time.sleep(2)
        return 2 * x

    with ray_cluster.connect():
        ref = slow_double.remote(21, str(marker))
        _wait_for(marker, timeout=30)  # the first attempt is under way, past its marker line
        killed = ray_cluster.kill_worker_running("slow_double", timeout=10)
        assert ray.get(ref, timeout=60) == 42
    attempts = marker.read_text().split()
    assert len(attempts) == 2 and attempts[0] == str(killed) != attempts[1], attempts


def test_kill_worker_running_times_out_when_no_worker_runs_the_task(ray_cluster: LocalRayCluster) -> None:
    with pytest.raises(TimeoutError, match="ray::no_such_task"):
        ray_cluster.kill_worker_running("no_such_task", timeout=0.2)


DRIVER = """
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False)
@ray.remote
def add(a, b):
    return a + b
print(ray.get(add.remote(40, 2), timeout=60), len([n for n in ray.nodes() if n["Alive"]]))
"""


def test_a_driver_in_another_process_connects(ray_cluster: LocalRayCluster) -> None:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, ray_cluster.address], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["42", "2"]
