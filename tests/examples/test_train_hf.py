"""examples/train_hf.py: its batches are weir's steps with Hugging Face's (unshifted) labels, and, with
``source_ids`` in the items, those and the weir step for the loss per source, whose per-token losses line up
with weir's labels; with ``transformers`` installed, a 2-process run under torchrun learns, logs the loss per
source (tests/examples/source_checks.py: the build's targets to the token, summing to the Trainer's loss) and
resumes from a checkpoint to the same losses (skipped, saying so, when transformers is absent)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from loaders import IGNORE_INDEX, PackedDataset, Payload, StepLoader, World
from tests.conftest import ROOT
from tests.examples.source_checks import check_source_log

SCRIPT = ROOT / "examples" / "train_hf.py"


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_hf", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_batches_are_the_steps_with_labels_a_hugging_face_model_shifts_back(tiny_build: Path) -> None:
    hf = example()
    batches = list(hf.HFBatches(StepLoader(PackedDataset(tiny_build, world=World(1, 2)))))
    steps = list(StepLoader(PackedDataset(tiny_build, world=World(1, 2))))
    assert len(batches) == len(steps) == 8 and not hasattr(hf.HFBatches, "__len__")  # max_steps, not an epoch
    for batch, step in zip(batches, steps, strict=True):
        mb = step.micro_batches[0]
        assert set(batch) == {"input_ids", "labels", "position_ids"}  # model inputs only
        assert torch.equal(batch["input_ids"], mb["input_ids"])
        # what HF's causal-LM loss does: predict labels[:, 1:] from logits[:, :-1]; it must be weir's targets
        assert torch.equal(batch["labels"][:, 1:], mb["labels"][:, :-1])
        assert (batch["labels"][:, 0] == IGNORE_INDEX).all() and (mb["labels"][:, -1] == IGNORE_INDEX).all()


def test_with_source_ids_batches_carry_them_and_losses_line_up_with_weirs_labels(tiny_build: Path) -> None:
    hf = example()
    payload = Payload(fields=hf.FIELDS)
    steps = list(StepLoader(PackedDataset(tiny_build, world=World(0, 2), payload=payload)))
    batches = list(hf.HFBatches(StepLoader(PackedDataset(tiny_build, world=World(0, 2), payload=payload))))
    torch.manual_seed(0)
    for batch, step in zip(batches, steps, strict=True):
        mb = step.micro_batches[0]
        assert set(batch) == {"input_ids", "labels", "position_ids", *hf.PROVENANCE}
        assert batch["weir_step"] == step.step and torch.equal(batch["source_ids"], mb["source_ids"])
        assert torch.equal(hf.weir_labels(batch["labels"]), mb["labels"])  # the inverse of hf_labels
        b, s = mb["labels"].shape
        logits = torch.randn(b, s, 11)
        labels = torch.where(mb["labels"] == IGNORE_INDEX, IGNORE_INDEX, mb["labels"] % 11)  # a vocabulary of 11
        got = hf.source_losses(logits, hf.hf_labels(labels))
        want = torch.nn.functional.cross_entropy(
            logits.reshape(-1, 11), labels.reshape(-1), ignore_index=IGNORE_INDEX, reduction="none"
        ).view(b, s)  # position p predicts weir's labels[:, p]
        assert torch.allclose(got, want) and (got[labels == IGNORE_INDEX] == 0).all()


def test_trainer_learns_and_resumes_under_torchrun(tiny_build: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None:
        pytest.skip("transformers and accelerate are not installed (add them to the dev extras to run this)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT)]

    def train(out: Path, *args: str) -> list[dict[str, Any]]:  # losses.jsonl's rows: step (int), loss (float)
        proc = subprocess.run(
            [*launch, str(tiny_build), str(out), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]

    whole = train(tmp_path / "whole", "--save-steps", "4")
    assert [r["step"] for r in whole] == list(range(1, 9))
    assert whole[-1]["loss"] < whole[0]["loss"]
    # the Trainer's global step k is weir's step k - 1
    per_source = check_source_log(
        tmp_path / "whole", tiny_build, list(range(8)), {r["step"] - 1: r["loss"] for r in whole}
    )
    checkpoint = tmp_path / "whole" / "checkpoint-4"
    assert {f.name for f in checkpoint.glob("weir_loader_rank*.json")} == {
        "weir_loader_rank0.json",
        "weir_loader_rank1.json",
    }
    assert json.loads((checkpoint / "weir_loader_rank0.json").read_text())["step"] == 4
    resumed = train(tmp_path / "resumed", "--resume", str(checkpoint), "--no-plot")
    assert [r["step"] for r in resumed] == list(range(5, 9))
    for a, b in zip(resumed, whole[4:], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3)
    again = check_source_log(tmp_path / "resumed", tiny_build, [4, 5, 6, 7], None, plot=False)
    for a, b in zip(again, [r for r in per_source if r["step"] >= 4], strict=True):
        assert (a["step"], a["source"], a["tokens"]) == (b["step"], b["source"], b["tokens"])
        assert a["loss_sum"] == pytest.approx(b["loss_sum"], rel=1e-3)
