"""RayEngine on a real Ray cluster: the function's own exception reaches the caller as its own type; a task whose
worker dies on every attempt is an EngineError (a WeirError: ``weir build`` prints it in one line); work submitted
ahead runs once and is collected by the map that asks for it."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

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


def _record(folder: str, item: int) -> int:
    """Leaves one file per run of ``item`` (the workers share this machine's disk)."""
    (Path(folder) / f"{item}-{uuid.uuid4().hex}").touch()
    return item * item


def test_work_submitted_ahead_runs_once_and_each_map_collects_its_own(
    ray_cluster: LocalRayCluster, tmp_path: Path
) -> None:
    engine = RayEngine(ray_cluster.address)
    folder = str(tmp_path)
    with ray_cluster.connect():
        before = time.perf_counter()
        assert engine.submit_ahead(_record, range(10), folder, "square", key=str) == 10
        assert engine.is_ahead("square", "3") and not engine.is_ahead("other", "3")
        since = engine.ahead_since("square", ["3", "99"])  # a rate over work done ahead counts from here
        assert since is not None and before <= since <= time.perf_counter()
        assert engine.ahead_since("square", ["99"]) is None and engine.ahead_since("other", ["3"]) is None
        # a map over some of them and others: the others run now, the ahead ones are collected
        first = dict(engine.map(_record, [3, 12, 4, 13], folder, "square", key=str))
        assert first == {0: 9, 1: 144, 2: 16, 3: 169}
        assert not engine.is_ahead("square", "3") and engine.is_ahead("square", "5")
        rest = [i for i in range(10) if i not in (3, 4)]
        assert sorted(r for _i, r in engine.map(_record, rest, folder, "square", key=str)) == [i * i for i in rest]
        assert not any(engine.is_ahead("square", str(i)) for i in range(10))
        assert engine.ahead_since("square", [str(i) for i in range(10)]) is None  # collected: no longer ahead
        runs = sorted(int(p.name.split("-")[0]) for p in tmp_path.iterdir())
        assert runs == [*range(10), 12, 13]  # every item ran exactly once
        engine.submit_ahead(_record, [20], folder, "square", key=str)
        engine.forget()  # a build that ends drops what it did not collect
        assert not engine.is_ahead("square", "20")
