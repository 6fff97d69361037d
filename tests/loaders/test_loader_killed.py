"""``loaders.loader.PackedLoader`` with DataLoader workers, one of which is killed mid-pass: the consumer gets one
:class:`WorkerKilledError` line naming the worker's pid and signal, the likely cause (the OOM killer, for SIGKILL)
and how to check it (``dmesg``), and how to resume; resuming from ``state_dict()`` then gives exactly the rest of
the stream. Torch may notice the death in its ``SIGCHLD`` handler (which raises wherever the main thread is) or
in the iterator: either way the consumer sees weir's error, and a plain DataLoader's workers keep torch's.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from loaders import PackedDataset, PackedLoader, World
from loaders.loader import WorkerKilledError

WORLD = World(0, 1)


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children()}


def _killed_mid_pass(build: Path, sig: signal.Signals) -> tuple[list[dict[str, Any]], PackedLoader, str]:
    """A pass of a 2-worker loader whose first worker gets ``sig`` once the first item is in: the items received,
    the loader and the error's text."""
    loader = PackedLoader(PackedDataset(build, world=WORLD), num_workers=2, prefetch_factor=2)
    before = _children()
    got: list[dict[str, Any]] = []
    it = iter(loader)
    got.append(next(it))
    workers = sorted(_children() - before)
    assert len(workers) == 2, workers
    with pytest.raises(WorkerKilledError) as e:  # torch's SIGCHLD handler may run at once, here
        os.kill(workers[0], sig)
        got.extend(it)
    return got, loader, str(e.value)


@pytest.mark.slow
def test_a_worker_killed_by_sigkill_is_named_in_one_line_and_the_stream_resumes_exactly(tiny_build: Path) -> None:
    reference = list(PackedDataset(tiny_build, world=WORLD))
    got, loader, msg = _killed_mid_pass(tiny_build, signal.SIGKILL)
    assert "\n" not in msg
    assert msg.startswith("a DataLoader worker of weir's PackedLoader (pid ") and "was killed by SIGKILL" in msg
    assert "OOM killer" in msg and "dmesg" in msg and "loader.state_dict()" in msg, msg
    last = got[-1]
    assert f"last item handed out: step {int(last['step'])}, slot {int(last['slot'])};" in msg
    # what was received is the stream's head, and the state resumes right after it
    assert len(got) < len(reference) and all(_same(a, b) for a, b in zip(got, reference, strict=False))
    resumed = PackedLoader(PackedDataset(tiny_build, world=WORLD), num_workers=2)
    resumed.load_state_dict(loader.state_dict())
    rest = list(resumed)
    assert len(got) + len(rest) == len(reference)
    assert all(_same(a, b) for a, b in zip(got + rest, reference, strict=True))


@pytest.mark.slow
def test_a_worker_ended_by_another_signal_is_named_without_the_oom_killer(tiny_build: Path) -> None:
    # SIGUSR1, not SIGHUP: a suite started under nohup passes SIGHUP ignored down to the workers
    _, _, msg = _killed_mid_pass(tiny_build, signal.SIGUSR1)
    assert "was killed by SIGUSR1" in msg and "OOM" not in msg and "\n" not in msg, msg


class _Counting(IterableDataset[int]):
    def __iter__(self) -> Iterator[int]:
        yield from range(10**6)


@pytest.mark.slow
def test_a_plain_dataloaders_killed_worker_keeps_torchs_own_error(tiny_build: Path) -> None:
    list(PackedLoader(PackedDataset(tiny_build, world=WORLD), num_workers=1))  # the SIGCHLD handler is weir's now
    loader = DataLoader(_Counting(), num_workers=1, batch_size=None)
    before = _children()
    it = iter(loader)
    next(it)
    (worker,) = _children() - before
    with pytest.raises(RuntimeError) as e:
        os.kill(worker, signal.SIGKILL)
        for _ in it:
            pass
    assert not isinstance(e.value, WorkerKilledError) and str(worker) in str(e.value)
