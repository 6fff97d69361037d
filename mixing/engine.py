"""Where a build's fan-out work runs: in this process (:class:`LocalEngine`, the embedded default) or as tasks
on a Ray cluster (:class:`RayEngine`).

A stage hands an engine one function and many small, picklable work items (a chunk of files to tokenize, a
shard to write); each item's outputs go straight to the build root by the item's own code, and only a small
summary comes back to the caller. Both engines run the *same* function on the same items, so a Ray build
equals the local one byte for byte by construction.

Fault tolerance is Ray's: a task whose worker process dies (killed, out of memory, node lost) is run again,
up to ``max_retries`` times, and is an :class:`EngineError` when every attempt died; an exception raised by the
function itself is not retried (it is the data's or the code's, and would fail again) and reaches the caller as
that exception. Work items must therefore be idempotent: written under write-once keys, or whole-file puts that
a retry simply repeats.

Threads: a Ray task runs on the CPUs Ray assigned it (one, by default), but a tokenizer sizes its thread
pool by ``RAYON_NUM_THREADS``, else by the machine's cores (:mod:`mixing.ingest.tokenizer`): every worker of a
64-core node would run 64 tokenizer threads. So a task sets ``RAYON_NUM_THREADS`` on its worker to the task's
CPUs where the worker's environment does not set it (as Ray itself sets ``OMP_NUM_THREADS``).

Submitting ahead: a build whose stage runs once per source (one Dagster run each, one after another in
``weir build``) would leave a cluster idle at the end of every source. :meth:`RayEngine.submit_ahead` submits
the work of every source at once, before the first run; each run's :meth:`~Engine.map` then collects the
results of its own items (matched by ``(label, key(item))``) instead of submitting them again, so the
cluster works on all sources side by side while the runs still finish in order. What was submitted ahead
lives in this process only (Ray's tasks die with their driver): :meth:`~Engine.forget` drops it.

Ray is imported only when a :class:`RayEngine` first submits work: the embedded default never needs it.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from contract.errors import WeirError

__all__ = ["LOCAL", "Engine", "EngineError", "LocalEngine", "RayEngine"]

S = TypeVar("S")
T = TypeVar("T")
R = TypeVar("R")


class EngineError(WeirError):
    """The engine could not run work (no Ray installed, no cluster at the address, a task whose worker died on
    every attempt)."""


Key = Callable[[Any], str]  # an item's name among the items of one label (a chunk's key)


class Engine(Protocol):
    """Runs ``fn(shared, item)`` for every item; yields ``(index, result)`` as each finishes (any order).

    With ``key``, an item submitted ahead under the same ``label`` and key is collected, not run again.
    """

    @property
    def name(self) -> str: ...

    @property
    def workers(self) -> int: ...

    def map(
        self, fn: Callable[[S, T], R], items: Iterable[T], shared: S, label: str, key: Key | None = None
    ) -> Iterator[tuple[int, R]]: ...

    def submit_ahead(self, fn: Callable[[S, T], R], items: Iterable[T], shared: S, label: str, key: Key) -> int:
        """Start ``fn(shared, item)`` for every item now, for a later :meth:`map` to collect; returns how many
        were submitted (0 where the engine cannot run work ahead)."""
        ...

    def is_ahead(self, label: str, key: str) -> bool:
        """Whether an item of ``label`` named ``key`` was submitted ahead and not collected yet."""
        ...

    def ahead_since(self, label: str, keys: Iterable[str]) -> float | None:
        """When (``time.perf_counter``) the first of ``keys`` still ahead under ``label`` was submitted; None if
        none is. A rate over work that started ahead counts from then, not from its collection."""
        ...

    def forget(self) -> None:
        """Drop (and cancel) everything submitted ahead and not collected."""
        ...


@dataclass(frozen=True)
class LocalEngine:
    """Every item in this process, one after another, in order."""

    name: str = "local"

    @property
    def workers(self) -> int:
        return 1

    def map(
        self, fn: Callable[[S, T], R], items: Iterable[T], shared: S, label: str, key: Key | None = None
    ) -> Iterator[tuple[int, R]]:
        for i, item in enumerate(items):
            yield i, fn(shared, item)

    def submit_ahead(self, fn: Callable[[S, T], R], items: Iterable[T], shared: S, label: str, key: Key) -> int:
        return 0  # one process: nothing runs beside the caller

    def is_ahead(self, label: str, key: str) -> bool:
        return False

    def ahead_since(self, label: str, keys: Iterable[str]) -> float | None:
        return None

    def forget(self) -> None:
        pass


@dataclass(frozen=True)
class RayEngine:
    """Items as Ray tasks on the cluster at ``address`` (``None``: a Ray instance started on this machine).

    ``shared`` is put in Ray's object store once per :meth:`map`, not shipped with every task. At most
    ``inflight`` tasks per worker are submitted ahead of the results, so the driver never holds more than
    that many items or results (items may be generated lazily). The task's name (``label``) is the worker
    process's title while it runs (``ray::<label>``), which is what an operator sees in ``ps`` and Ray's UI.
    """

    address: str | None = None
    max_retries: int = 3
    inflight: int = 4
    name: str = "ray"

    def connect(self) -> Any:
        """The ``ray`` module, connected to the cluster (once per process)."""
        try:
            import ray
        except ImportError:
            raise EngineError("the ray engine needs ray: pip install 'ray>=2.40'") from None
        with _CONNECT:  # once per process, whichever thread asks first
            if ray.is_initialized():
                return ray
            try:
                ray.init(
                    address=self.address, logging_level=logging.ERROR, log_to_driver=False, include_dashboard=False
                )
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise EngineError(f"no Ray cluster at {self.address or 'this machine'}: {e}") from None
        return ray

    @property
    def workers(self) -> int:
        return max(1, int(self.connect().cluster_resources().get("CPU", 1)))

    def _task(self, ray: Any, label: str) -> Any:
        return ray.remote(_call).options(name=label, max_retries=self.max_retries, retry_exceptions=False)

    def submit_ahead(self, fn: Callable[[S, T], R], items: Iterable[T], shared: S, label: str, key: Key) -> int:
        """Submit every item now (no limit in flight: Ray queues them; an item is a few rows); a later
        :meth:`map` with the same ``label`` and ``key`` collects them."""
        ray = self.connect()
        task, ref, n, now = self._task(ray, label), ray.put(shared), 0, time.perf_counter()
        for item in items:
            _AHEAD[(label, key(item))] = task.remote(fn, ref, item)
            _AHEAD_AT[(label, key(item))] = now
            n += 1
        return n

    def is_ahead(self, label: str, key: str) -> bool:
        return (label, key) in _AHEAD

    def ahead_since(self, label: str, keys: Iterable[str]) -> float | None:
        return min((t for t in (_AHEAD_AT.get((label, k)) for k in keys) if t is not None), default=None)

    def forget(self) -> None:
        if _AHEAD:
            ray = self.connect()
            for ref in _AHEAD.values():
                ray.cancel(ref)
            _AHEAD.clear()
            _AHEAD_AT.clear()

    def map(
        self, fn: Callable[[S, T], R], items: Iterable[T], shared: S, label: str, key: Key | None = None
    ) -> Iterator[tuple[int, R]]:
        ray = self.connect()
        task = self._task(ray, label)
        shared_ref = None  # put once, and only if some item is not collected from ahead
        limit = max(1, self.workers * self.inflight)
        pending: dict[Any, tuple[int, bool]] = {}  # ref -> (index, submitted by this call)
        own = 0
        source = enumerate(items)
        exhausted = False
        while True:
            while not exhausted and own < limit:
                nxt = next(source, None)
                if nxt is None:
                    exhausted = True
                    break
                i, item = nxt
                ahead = _AHEAD.pop((label, key(item)), None) if key else None
                if ahead is not None and key:
                    del _AHEAD_AT[(label, key(item))]
                if ahead is not None:
                    pending[ahead] = (i, False)
                    continue
                if shared_ref is None:
                    shared_ref = ray.put(shared)
                pending[task.remote(fn, shared_ref, item)] = (i, True)
                own += 1
            if not pending:
                break
            refs = list(pending)
            first, rest = ray.wait(refs, num_returns=1)
            # everything else finished by now too, in one more pass: never one pass over all refs per result
            more = ray.wait(rest, num_returns=len(rest), timeout=0)[0] if rest else []
            for done in [*first, *more]:
                i, mine = pending.pop(done)
                own -= mine
                yield i, self._result(ray, done, pending, label, i)

    def _result(self, ray: Any, ref: Any, pending: dict[Any, tuple[int, bool]], label: str, i: int) -> Any:
        """``ref``'s value; on failure cancel ``pending`` and raise the task's own error or an EngineError."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as e:
            for left in pending:
                ray.cancel(left)
            if isinstance(e, ray.exceptions.RayTaskError):  # the function's own exception, as its own type
                raise e.as_instanceof_cause() from None
            # its worker (or node) died on every attempt, or Ray lost its result: not the data's fault
            why = " ".join(str(e).split())[:300]
            raise EngineError(
                f"{label} task {i} failed after {self.max_retries} retries: {type(e).__name__}: {why}"
            ) from None


_CONNECT = threading.Lock()
_AHEAD: dict[tuple[str, str], Any] = {}  # (label, key) -> the ref of a task submitted ahead (module docstring)
_AHEAD_AT: dict[tuple[str, str], float] = {}  # (label, key) -> when it was submitted (time.perf_counter)
LOCAL = LocalEngine()
"""The embedded default."""


def _call(fn: Callable[[S, T], R], shared: S, item: T) -> R:
    """``fn(shared, item)`` on a Ray worker, its thread pools sized to the task's CPUs (module docstring)."""
    if "RAYON_NUM_THREADS" not in os.environ:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0)
        os.environ["RAYON_NUM_THREADS"] = str(max(1, math.floor(cpus)))
    return fn(shared, item)
