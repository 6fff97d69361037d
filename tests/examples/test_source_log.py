"""examples/source_log.py, in one process: the log's rows (a source without targets in a step has none), a
run starting at step N dropping the rows of steps ≥ N that a killed run left, and the checks of a step's
micro-batches (the plot: the examples' own tests, which run them whole)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loaders import IGNORE_INDEX
from tests.examples.source_checks import source_log


def run_steps(log: object, steps: range, scale: float) -> None:
    """Steps of 2 micro-batches: source 0 gets targets every step, source 1 on even steps only, source 2 never
    (its one position has label -100); the losses are ``scale`` × (step + 1)."""
    for t in steps:
        for _ in range(2):
            source_ids = torch.tensor([0, 0, 1 if t % 2 == 0 else 0, 2, -1], dtype=torch.int32)
            labels = torch.tensor([5, 6, 7, IGNORE_INDEX, IGNORE_INDEX])
            log.add(t, torch.full((5,), scale * (t + 1)), labels, source_ids)  # type: ignore[attr-defined]
        log.end_step()  # type: ignore[attr-defined]


def expected(steps: range, scale: float) -> list[tuple[int, str, float, int]]:
    """The rows :func:`run_steps` makes: per step, source a 4 targets and b 2 (even steps) or a 6 (odd)."""
    rows: list[tuple[int, str, float, int]] = []
    for t in steps:
        loss = scale * (t + 1)
        rows += [(t, "a", 4 * loss, 4), (t, "b", 2 * loss, 2)] if t % 2 == 0 else [(t, "a", 6 * loss, 6)]
    return rows


def test_rows_and_a_restart_dropping_the_steps_it_trains_again(tmp_path: Path) -> None:
    mod = source_log()
    path = tmp_path / mod.LOG_NAME
    run_steps(mod.SourceLossLog(["a", "b", "c"], path), range(6), 1.0)  # killed after step 5, saved at step 3
    run_steps(mod.SourceLossLog(["a", "b", "c"], path), range(3, 8), 10.0)  # resumed at step 3
    rows = [(int(r["step"]), r["source"], float(r["loss_sum"]), int(r["tokens"])) for r in mod.read_rows(path)]
    assert rows == expected(range(3), 1.0) + expected(range(3, 8), 10.0)  # steps 3-5 once, the resumed run's
    assert path.read_text().splitlines()[0] == "step,source,loss_sum,tokens"  # the plot: the examples' tests


def test_a_steps_micro_batches_are_of_that_step_and_other_ranks_write_nothing(tmp_path: Path) -> None:
    mod = source_log()
    log = mod.SourceLossLog(["a"], None)  # not rank 0
    assert log.end_step() is None  # nothing added
    log.add(0, torch.ones(2), torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int32))
    with pytest.raises(ValueError, match="end_step"):
        log.add(1, torch.ones(2), torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int32))
    loss_sum, tokens = log.end_step()
    assert loss_sum.tolist() == [2.0] and tokens.tolist() == [2] and not list(tmp_path.iterdir())
