"""examples/train_hf.py: its batches are weir's steps with Hugging Face's (unshifted) labels; with
``transformers`` installed, a 2-process run under torchrun learns and resumes from a checkpoint to the same
losses (skipped, saying so, when transformers is absent)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from loaders import IGNORE_INDEX, PackedDataset, StepLoader, World
from tests.conftest import ROOT

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


def test_trainer_learns_and_resumes_under_torchrun(tiny_build: Path, tmp_path: Path) -> None:
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None:
        pytest.skip("transformers and accelerate are not installed (add them to the dev extras to run this)")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(SCRIPT)]

    def train(out: Path, *args: str) -> list[dict[str, float]]:
        proc = subprocess.run(
            [*launch, str(tiny_build), str(out), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]

    whole = train(tmp_path / "whole", "--save-steps", "4")
    assert [r["step"] for r in whole] == list(range(1, 9))
    assert whole[-1]["loss"] < whole[0]["loss"]
    checkpoint = tmp_path / "whole" / "checkpoint-4"
    assert {f.name for f in checkpoint.glob("weir_loader_rank*.json")} == {
        "weir_loader_rank0.json",
        "weir_loader_rank1.json",
    }
    assert json.loads((checkpoint / "weir_loader_rank0.json").read_text())["step"] == 4
    resumed = train(tmp_path / "resumed", "--resume", str(checkpoint))
    assert [r["step"] for r in resumed] == list(range(5, 9))
    for a, b in zip(resumed, whole[4:], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-3)
