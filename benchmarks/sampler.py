"""CPU seconds and peak memory of a benchmark's driver process and of a Ray cluster's processes, polled with
psutil (``benchmarks/scale.py``): what each stage of a build costs the driver, the workers and Ray's daemons.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

__all__ = ["MEMORY", "Sampler"]

MEMORY = ("driver_rss", "driver_anon", "worker_rss", "worker_anon")  # anon: RSS less file-backed and shared pages


def _peaks(peak: dict[str, int], who: str, mem: Any) -> None:
    """Raise ``peak``'s RSS and anonymous memory of ``who`` to ``mem`` (psutil's memory_info)."""
    peak[f"{who}_rss"] = max(peak[f"{who}_rss"], mem.rss)
    peak[f"{who}_anon"] = max(peak[f"{who}_anon"], mem.rss - mem.shared)


class Sampler:
    """CPU seconds and peak memory of the driver (this process) and of a Ray cluster's processes.

    A thread polls every ``period`` seconds: the driver's resident memory, and each cluster process's CPU time
    (psutil, user + system) and, for workers, resident memory. It keeps the last CPU time per process, so a
    process that exits keeps what it had used up to the poll before, and the largest memory seen since the
    last :meth:`snapshot`. The driver's CPU is ``time.process_time`` less what the polling itself cost.
    """

    def __init__(self, cluster: Any, period: float = 0.2) -> None:
        import psutil

        self.cluster = cluster
        self.period = period
        self.me = psutil.Process()
        self.cpu: dict[tuple[int, float], tuple[bool, float]] = {}  # (pid, create time): (is a worker, seconds)
        self.overhead = 0.0  # CPU seconds spent polling, in any thread of this process
        self.peak = dict.fromkeys(MEMORY, 0)  # bytes: the largest seen since the last snapshot
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.poll()

    def poll(self) -> None:
        import psutil

        t = time.thread_time()
        seen, peak = {}, dict.fromkeys(MEMORY, 0)
        for proc in self.cluster.processes() if self.cluster is not None else []:
            try:
                with proc.oneshot():
                    title = proc.cmdline()[:1] or [""]
                    worker = title[0].startswith("ray::") or any("default_worker.py" in c for c in proc.cmdline())
                    times = proc.cpu_times()
                    seen[(proc.pid, proc.create_time())] = (worker, times.user + times.system)
                    if worker:
                        _peaks(peak, "worker", proc.memory_info())
            except psutil.Error:  # ended while we looked: its last polled value stays
                continue
        _peaks(peak, "driver", self.me.memory_info())
        with self._lock:
            self.cpu.update(seen)
            self.peak = {k: max(v, peak[k]) for k, v in self.peak.items()}
            self.overhead += time.thread_time() - t

    def snapshot(self) -> dict[str, float]:
        """CPU seconds so far (``driver``, Ray ``workers``, Ray ``daemons``), and the largest memory (MB) of the
        driver and of one worker since the last snapshot (:data:`MEMORY`)."""
        self.poll()
        with self._lock:
            workers = sum(s for w, s in self.cpu.values() if w)
            daemons = sum(s for w, s in self.cpu.values() if not w)
            peak, self.peak = self.peak, dict.fromkeys(MEMORY, 0)
            cpu = {"driver": time.process_time() - self.overhead, "workers": workers, "daemons": daemons}
            mem = self.me.memory_info()
            now = {"driver_anon_now": (mem.rss - mem.shared) / 2**20}  # where the next stage starts from
            return cpu | {k: v / 2**20 for k, v in peak.items()} | now
