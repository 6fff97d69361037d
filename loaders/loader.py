"""``PackedLoader``: a torch ``DataLoader`` over a :class:`PackedDataset` whose state is what the consumer got.

With ``num_workers > 0`` each worker process holds its own copy of the dataset and reads every
``num_workers``-th item of the rank's stream; the DataLoader hands them back in stream order (``in_order``),
so the consumer sees exactly the ``num_workers=0`` stream. Prefetched items the consumer never received
must not count as read, so the state is computed here, from the ``(step, slot)`` of the last item handed
out, not by the workers. A refined planner (``loaders.refinement``) chains its windows; the workers pass
each window's context along with their items, so that saving a state here never refines a window itself.

A worker process that dies mid-pass (SIGKILL from the kernel's OOM killer, most often) is reported as a
:class:`WorkerKilledError`: one line naming its pid and signal, the likely cause and how to check it, and the
position to resume from. Torch notices a dead worker in two places: while the consumer waits for an item (a
``ConnectionResetError`` or ``RuntimeError`` out of the iterator, caught here) and in its ``SIGCHLD`` handler,
which raises in whatever the main thread runs at that moment, most often the consumer's training step, outside
any frame of the loader; so a loader with workers also wraps that handler (once per process, chaining to it),
for the workers of its own passes only.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from contract.errors import WeirError
from loaders.dataset import SHARED_CONTEXTS, PackedDataset

__all__ = ["PackedLoader", "WorkerKilledError"]


class WorkerKilledError(WeirError, RuntimeError):
    """A DataLoader worker process of a :class:`PackedLoader` died during a pass (killed by a signal, or exited);
    ``str(err)`` is one line: its pid, how it ended, the likely cause and how to check it, where to resume."""


class PackedLoader(DataLoader):
    """``DataLoader(dataset, batch_size=None, ...)`` with exact ``state_dict()``/``load_state_dict()``.

    Items are single sequences (``batch_size=None``: varlen sequences are not stacked); other keyword
    arguments (``num_workers``, ``pin_memory``, ``prefetch_factor`` …) pass through. For one optimizer step
    at a time (stacked or variable-length), wrap it in :class:`loaders.steps.StepLoader`.

    A new ``iter`` continues where the consumer stopped; once the whole build was read it raises
    :class:`loaders.dataset.ExhaustedError` (call :meth:`rewind` for another pass).
    """

    def __init__(self, dataset: PackedDataset, **kwargs: Any) -> None:
        if kwargs.pop("batch_size", None) is not None:
            raise ValueError(
                "PackedLoader yields one packed sequence per item; batch_size must stay None (for a step's "
                "sequences stacked [B, S] or as one varlen micro-batch, iterate loaders.StepLoader(loader))"
            )
        if kwargs.get("persistent_workers"):
            # persistent workers keep their own copy of the position, so a resumed pass would not reach them
            raise ValueError("PackedLoader does not support persistent_workers=True (its state lives in the workers)")
        super().__init__(dataset, batch_size=None, in_order=True, **kwargs)
        self._last: tuple[int, int] | None = None

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        if self._last is not None:  # a new pass continues where the consumer stopped, with workers or without
            self.dataset.load_state_dict(self.state_dict())  # type: ignore[attr-defined]
            self._last = None
        self.dataset.check_not_exhausted()  # type: ignore[attr-defined]
        planner = self.dataset.planner  # type: ignore[attr-defined]
        workers: list[Any] = []  # the worker processes of this pass (none without workers)
        try:
            it = super().__iter__()
            workers = list(getattr(it, "_workers", ()))
            for w in workers:
                _PASSES[w.pid] = (self, w)
            if workers:
                _wrap_sigchld()
            for item in it:
                for first_step, context in item.pop(SHARED_CONTEXTS, {}).items():
                    planner.seed_context(first_step, context)  # so that state_dict() refines nothing here
                self._last = (int(item["step"]), int(item["slot"]))
                yield item
        except WeirError as e:
            raise _one_line(e) from None
        except (RuntimeError, ConnectionError, EOFError) as e:  # how torch reports a worker gone mid-pass
            dead = _dead_worker(workers, e)
            if dead is None:
                raise
            _shutdown(it)  # its SIGCHLD handler raises no second time for this pass
            raise WorkerKilledError(_killed(self, dead)) from None
        finally:
            for w in workers:
                _PASSES.pop(w.pid, None)

    def state_dict(self) -> dict[str, Any]:
        """Position just after the last item this loader handed to its consumer."""
        ds: PackedDataset = self.dataset  # type: ignore[assignment]
        return ds.state_dict() if self._last is None else ds.state_at(*self._last)

    def rewind(self) -> None:
        """Start another pass over the whole build, from step 0 (see :meth:`PackedDataset.rewind`)."""
        self.dataset.rewind()  # type: ignore[attr-defined]
        self._last = None

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (see :meth:`PackedDataset.load_state_dict`); takes effect at the next ``iter``."""
        self.dataset.load_state_dict(state)  # type: ignore[attr-defined]
        self._last = None


def _one_line(e: WeirError) -> WeirError:
    """``e`` as its own one-line message: a worker's error comes back as the text of its whole traceback,
    whose last line is ``module.Class: message``."""
    text = str(e).rstrip()
    if "Original Traceback" not in text:
        return e
    last = text.splitlines()[-1]
    name = f"{type(e).__module__}.{type(e).__qualname__}: "
    try:
        return type(e)(last.removeprefix(name))
    except Exception:
        return e


# worker pid -> the loader whose current pass it serves, and its process (entries live as long as the pass)
_PASSES: dict[int, tuple[PackedLoader, Any]] = {}
_WRAPPED: list[bool] = []  # [True] once this process's SIGCHLD handler was looked at (and wrapped if torch's)
_TORCH_KILLED = re.compile(r"DataLoader worker \(pids?\(?s?\)? ([\d, ]+)\) (?:is killed by signal|exited unexpectedly)")


def _dead_worker(workers: list[Any], e: BaseException) -> Any:
    """The worker process of ``workers`` that ended (torch's message names its pid, or the first one seen ended
    within a second: a reset connection comes as the dying worker closes its files, before it can be waited
    for); None when ``e`` is no worker's death."""
    m = _TORCH_KILLED.search(str(e))
    named = {int(p) for p in m[1].split(",")} if m else set()
    if not workers or not (named or isinstance(e, ConnectionError | EOFError)):
        return None
    deadline = time.monotonic() + 1.0
    while True:
        ended = [w for w in workers if w.pid in named or w.exitcode is not None]
        if ended or time.monotonic() > deadline:
            return ended[0] if ended else None
        time.sleep(0.02)


def _killed(loader: PackedLoader, worker: Any) -> str:
    """The one-line account of ``worker``'s death during ``loader``'s pass."""
    code = worker.exitcode
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        how = f"was killed by {name}"
    else:
        how = "exited unexpectedly" + (f" (exit code {code})" if code else "")
    cause = (
        "most likely by the kernel's OOM killer (check: dmesg -T | grep -iE 'killed process|out of memory'; "
        "then lower num_workers or prefetch_factor, or give the job more memory)"
        if code == -signal.SIGKILL
        else "see its output above, and dmesg -T for the kernel's account"
    )
    at = f"step {loader._last[0]}, slot {loader._last[1]}" if loader._last is not None else "none yet"
    return (
        f"a DataLoader worker of weir's PackedLoader (pid {worker.pid}) {how}, {cause}; last item handed out: "
        f"{at}; resume with loader.load_state_dict() of the state saved with your last checkpoint, or of "
        "loader.state_dict() taken now (the position right after that item)"
    )


def _shutdown(it: Any) -> None:
    """Stop ``it``'s other workers now (torch's iterator would when collected; an exception's traceback keeps it)."""
    stop = getattr(it, "_shutdown_workers", None)
    if stop is not None:
        stop()


def _wrap_sigchld() -> None:
    """Wrap torch's ``SIGCHLD`` handler (once per process, from the main thread, where torch installed it) so that
    the death of a worker of a :class:`PackedLoader`'s pass raises :class:`WorkerKilledError` instead of torch's
    bare ``RuntimeError``; any other process's end goes to torch's handler as before."""
    if _WRAPPED or threading.current_thread() is not threading.main_thread():
        return
    _WRAPPED.append(True)  # torch installed its handler as the first pass with workers started, before this call
    torch_handler = signal.getsignal(signal.SIGCHLD)
    if not callable(torch_handler) or "torch" not in getattr(torch_handler, "__module__", ""):
        return  # torch installed none (another platform), or someone replaced it: leave the process's as it is

    def handler(signum: int, frame: Any) -> None:
        try:
            torch_handler(signum, frame)
        except RuntimeError as e:
            m = _TORCH_KILLED.search(str(e))
            pids = [int(p) for p in m[1].split(",")] if m else []
            known = [_PASSES[p] for p in pids if p in _PASSES]
            if not known:
                raise
            loader, worker = known[0]
            worker.join(1.0)  # dead: its exit code (and so the signal) is there to read at once
            raise WorkerKilledError(_killed(loader, worker)) from None

    signal.signal(signal.SIGCHLD, handler)
