"""A real Ray cluster on 127.0.0.1 (two nodes unless told) for tests and benchmarks, and the SIGKILL of the
worker running a given task.

Ray is imported only when a cluster starts: :data:`RAY_ENV` must be in the environment before ``import ray``
(``tests/conftest.py`` sets it for the whole session), so importing this module never imports Ray.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil
    from ray.cluster_utils import Cluster

__all__ = ["LOOPBACK", "RAY_ENV", "LocalRayCluster"]

LOOPBACK = "127.0.0.1"
RAY_ENV: dict[str, str] = {
    # Ray rewrites "127.0.0.1" in any address it is given (ray.init, a driver's RAY_ADDRESS) into this host's
    # outward IP, where a cluster bound to 127.0.0.1 does not listen; "0" makes Ray take the loopback address as
    # this host's own (Ray's switch for single-machine clusters, read once when ray is imported).
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    # no usage report attempted: the tests reach nothing outside the machine
    "RAY_USAGE_STATS_ENABLED": "0",
}
NODES = 2
CPUS_PER_NODE = 1
OBJECT_STORE_BYTES = 128 * 2**20  # per node: the two fit the 2-core, 24 GB test machines


class LocalRayCluster:
    """A Ray cluster of ``nodes`` nodes (default two; 1 CPU and a 128 MiB object store each) with every node and its
    GCS on 127.0.0.1.

    ``with LocalRayCluster() as cluster:`` starts it (4 to 5 s on 2 cores) and stops it on exit (under 0.5 s):
    every process of the cluster ends, else the exit kills the rest and raises. Its Ray session files live in a
    private temporary folder (``RAY_TMPDIR`` while it runs), removed on exit, so it never touches ``/tmp/ray``
    of other Ray users on the machine; a plain ``ray.init()`` does not join it: drivers name
    :attr:`address`. Dashboard and autoscaler monitor are off. Requires :data:`RAY_ENV` set before
    ``import ray`` in this process, and in a driver subprocess's environment (inherited from ``os.environ``).
    """

    def __init__(self, nodes: int = NODES) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        self.nodes = nodes
        self._cluster: Cluster | None = None
        self._tmp: Path | None = None
        self._old_tmpdir: str | None = None

    @property
    def address(self) -> str:
        """The GCS address (``127.0.0.1:PORT``) that ``ray.init(address=...)`` takes, here or in a subprocess."""
        if self._cluster is None:
            raise RuntimeError("the Ray cluster is not running (use it inside `with LocalRayCluster() as c:`)")
        return str(self._cluster.address)

    def __enter__(self) -> LocalRayCluster:
        import ray
        from ray.cluster_utils import Cluster

        if ray.util.get_node_ip_address() != LOOPBACK:
            raise RuntimeError(
                f"ray was imported before {RAY_ENV} was in the environment: a cluster on {LOOPBACK} would be "
                "unreachable from this process (tests/conftest.py sets it at session start)"
            )
        self._tmp = Path(tempfile.mkdtemp(prefix="weir-ray-"))
        self._old_tmpdir = os.environ.get("RAY_TMPDIR")
        os.environ["RAY_TMPDIR"] = str(self._tmp)
        node: dict[str, Any] = {
            "num_cpus": CPUS_PER_NODE,
            "object_store_memory": OBJECT_STORE_BYTES,
            "node_ip_address": LOOPBACK,
        }
        try:
            self._cluster = Cluster()
            self._cluster.add_node(**node, include_dashboard=False, no_monitor=True)  # the head node
            for _ in range(self.nodes - 1):
                self._cluster.add_node(**node)
            self._cluster.wait_for_nodes()
            # Cluster records itself as "the latest cluster", which a plain ray.init() joins; a driver under test
            # must name the address it was given.
            (self._tmp / "ray" / "ray_current_cluster").unlink(missing_ok=True)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        import psutil
        import ray

        ray.shutdown()  # a driver in this process must not outlive the cluster it is connected to
        procs = self.processes()
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
        _, alive = psutil.wait_procs(procs, timeout=10)
        for proc in alive:
            proc.kill()
        if self._old_tmpdir is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = self._old_tmpdir
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if alive:
            raise RuntimeError(f"Ray processes outlived the cluster's shutdown and were killed: {alive}")

    @contextmanager
    def connect(self) -> Iterator[None]:
        """This process as a driver of the cluster for the ``with`` block (``ray.init`` / ``ray.shutdown``)."""
        import ray

        ray.init(address=self.address, logging_level=logging.WARNING, log_to_driver=False)
        try:
            yield
        finally:
            ray.shutdown()

    def kill_worker_running(self, task_name: str, timeout: float = 30.0) -> int:
        """SIGKILL the first worker of this cluster seen executing the task ``task_name``; return its pid.

        A Ray worker titles its process ``ray::<task name>`` (the function's ``__name__`` unless the task was
        given a name) while it runs that task, ``ray::IDLE`` otherwise. Polls every 20 ms; only this cluster's
        processes are looked at, never another Ray on the machine. Raises ``TimeoutError`` after ``timeout``
        seconds without such a worker.
        """
        import psutil

        title = f"ray::{task_name}"
        deadline = time.monotonic() + timeout
        while True:
            for proc in self.processes():
                if _title(proc) == title:
                    try:
                        proc.send_signal(signal.SIGKILL)  # at once: the task may end while others are looked at
                        return proc.pid
                    except psutil.Error:  # ended while we looked
                        continue
            if time.monotonic() > deadline:
                raise TimeoutError(f"no worker of the Ray cluster at {self.address} ran {title} within {timeout} s")
            time.sleep(0.02)

    def running(self, *task_names: str) -> list[psutil.Process]:
        """The workers of this cluster executing one of the tasks ``task_names`` now (titled ``ray::<name>``)."""
        titles = {f"ray::{name}" for name in task_names}
        return [proc for proc in self.processes() if _title(proc) in titles]

    def processes(self) -> list[psutil.Process]:
        """Every live process of the cluster: each node's own (GCS, raylet, ...) and all their descendants."""
        import psutil

        if self._cluster is None:
            return []
        procs = []
        for node in self._cluster.list_all_nodes():
            for infos in node.all_processes.values():
                for info in infos:
                    try:
                        root = psutil.Process(info.process.pid)
                        procs += [root, *root.children(recursive=True)]
                    except psutil.NoSuchProcess:
                        continue
        return procs


def _title(proc: psutil.Process) -> str | None:
    """The process's title (a Ray worker's ``ray::<task>``), or None when it ended or became a zombie."""
    import psutil

    try:
        return next(iter(proc.cmdline()), None)
    except psutil.Error:
        return None
