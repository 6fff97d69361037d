"""RayEngine's failures on a real Ray cluster: the function's own exception reaches the caller as its own type;
a task whose worker dies on every attempt is an EngineError (a WeirError: ``weir build`` prints it in one line)."""

from __future__ import annotations

import os
import signal

import pytest

from mixing.engine import EngineError, RayEngine
from tests.ray_cluster import LocalRayCluster


def test_the_functions_own_exception_reaches_the_caller_as_its_own_type(ray_cluster: LocalRayCluster) -> None:
    def refuse(_shared: None, item: int) -> int:
        raise ValueError(f"item {item} is bad")

    with ray_cluster.connect(), pytest.raises(ValueError, match="item 0 is bad"):
        list(RayEngine(ray_cluster.address).map(refuse, [0], None, "refuse"))


def test_a_task_whose_worker_dies_on_every_attempt_is_an_engine_error(ray_cluster: LocalRayCluster) -> None:
    def die(_shared: None, _item: int) -> int:
        os.kill(os.getpid(), signal.SIGKILL)
        return 0

    with ray_cluster.connect(), pytest.raises(EngineError, match=r"^doomed task 0 failed after 1 retries: WorkerCrash"):
        list(RayEngine(ray_cluster.address, max_retries=1).map(die, [0], None, "doomed"))
