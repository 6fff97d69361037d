"""A Ray task's thread pools are sized to the CPUs Ray gave it, not to the machine (mixing/engine.py)."""

from __future__ import annotations

import os

import pytest

from mixing.engine import RayEngine
from tests.ray_cluster import LocalRayCluster

pytest.importorskip("ray", reason="ray is not installed (the Ray engine's tests need a real Ray cluster)")


def test_a_ray_task_sees_rayon_num_threads_equal_to_its_cpus(ray_cluster: LocalRayCluster) -> None:
    def threads(_shared: None, _item: int) -> str | None:
        return os.environ.get("RAYON_NUM_THREADS")  # what the tokenizers size their pools by

    with ray_cluster.connect():
        got = dict(RayEngine(ray_cluster.address).map(threads, range(4), None, "threads"))
    # each node has 1 CPU and a task takes 1; a value the cluster's environment sets is kept
    assert got == dict.fromkeys(range(4), os.environ.get("RAYON_NUM_THREADS", "1"))
