"""examples/train_torch.py under torchrun (2 processes, gloo, CPU): the loss falls, a run resumed from its
checkpoint after step 4 equals the uninterrupted one, and a resume on 1 process (elastic, 2 → 1) trains the same
steps to the same losses (up to summation order). Each run's loss per source (tests/examples/source_checks.py):
one row per (step, source with targets), the build's targets to the token, summing to the step's loss; the
plot written at the end (the resumed runs: --no-plot)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.examples.source_checks import check_source_log

SCRIPT = ROOT / "examples" / "train_torch.py"


def train(procs: int, build: Path, run: Path, *args: str) -> list[dict[str, Any]]:
    """Run the example (torchrun for several processes, plain python for one); its losses.jsonl."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(procs)]
    cmd = [*(launch if procs > 1 else [sys.executable]), str(SCRIPT), str(build), str(run), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (run / "losses.jsonl").read_text().splitlines()]


@pytest.mark.slow  # three launches of torch (a few seconds each on an idle machine)
def test_loss_falls_and_a_resumed_run_equals_the_uninterrupted_one(tiny_build: Path, tmp_path: Path) -> None:
    whole = train(2, tiny_build, tmp_path / "whole", "--save-every", "4")
    assert [r["step"] for r in whole] == list(range(8))  # ds.facts.steps of the tiny build
    assert all(r["sequences"] == list(range(4 * r["step"], 4 * r["step"] + 4)) for r in whole)  # every step, once
    losses = [r["loss"] for r in whole]
    assert losses[-1] < losses[0] - 0.5 and sum(losses[-3:]) < sum(losses[:3])
    per_source = check_source_log(tmp_path / "whole", tiny_build, list(range(8)), {r["step"]: r["loss"] for r in whole})
    checkpoint = tmp_path / "whole" / "checkpoints" / "step-4.pt"  # as if killed after step 4 was saved

    resumed = train(2, tiny_build, tmp_path / "resumed", "--resume", str(checkpoint), "--no-plot")
    assert resumed == whole[4:]  # bit for bit: model, optimizer, LR schedule and loader state all restored
    again = check_source_log(tmp_path / "resumed", tiny_build, [4, 5, 6, 7], None, plot=False)
    assert again == [r for r in per_source if r["step"] >= 4]  # bit for bit too

    elastic = train(1, tiny_build, tmp_path / "elastic", "--resume", str(checkpoint), "--no-plot")  # 2 ranks → 1
    assert [(r["step"], r["sequences"]) for r in elastic] == [(r["step"], r["sequences"]) for r in whole[4:]]
    for a, b in zip(elastic, whole[4:], strict=True):  # the same steps; sums in another order only
        assert abs(a["loss"] - b["loss"]) < 1e-4 * abs(b["loss"])
    check_source_log(
        tmp_path / "elastic", tiny_build, [4, 5, 6, 7], {r["step"]: r["loss"] for r in elastic}, plot=False
    )
