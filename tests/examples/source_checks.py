"""What the training examples' loss-per-source log must hold (examples/source_log.py has the format), checked
against the build itself: the targets of every (step, source), counted from the loader's ``labels`` and
``source_ids`` with plain torch (not through ``loaders.provenance``), and each step's ``num_targets``."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from loaders import IGNORE_INDEX, PackedDataset, Payload, StepLoader, World
from tests.conftest import ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def source_log() -> ModuleType:
    """examples/source_log.py as a module (the examples import it as a sibling when run as scripts)."""
    spec = importlib.util.spec_from_file_location("source_log", ROOT / "examples" / "source_log.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_targets(build: Path) -> tuple[dict[tuple[int, str], int], dict[int, int]]:
    """Per (training step, source name) with targets: their count; and per step its ``num_targets``, all DP
    ranks together (one rank reading the whole of every step)."""
    ds = PackedDataset(
        build, world=World(0, 1), payload=Payload(fields=("input_ids", "labels", "cu_seqlens", "source_ids"))
    )
    names = ds.facts.sources
    per_source: dict[tuple[int, str], int] = {}
    per_step: dict[int, int] = {}
    for step in StepLoader(ds):
        per_step[step.step] = step.num_targets
        for mb in step.micro_batches:
            kept = mb["source_ids"][mb["labels"] != IGNORE_INDEX].long()
            assert (kept >= 0).all()  # every target's token has a source
            for s, k in enumerate(torch.bincount(kept, minlength=len(names)).tolist()):
                if k:
                    per_source[step.step, names[s]] = per_source.get((step.step, names[s]), 0) + k
    return per_source, per_step


def check_source_log(
    run: Path, build: Path, steps: list[int], step_loss: dict[int, float] | None, plot: bool = True
) -> list[dict]:
    """``run``'s log has one row per (step, source with targets) of ``steps``, each with the build's target
    count, every step's tokens summing to its ``num_targets``; with ``step_loss`` (the example's own mean loss
    per step), Σ loss_sum / Σ tokens of each step equals it; with ``plot``, the plot is a PNG. Returns the
    rows (typed)."""
    log = source_log()
    path = run / log.LOG_NAME
    assert path.read_text().splitlines()[0] == ",".join(log.COLUMNS)
    rows = [
        {"step": int(r["step"]), "source": r["source"], "loss_sum": float(r["loss_sum"]), "tokens": int(r["tokens"])}
        for r in log.read_rows(path)
    ]
    got = {(r["step"], r["source"]): r["tokens"] for r in rows}
    assert len(got) == len(rows)  # one row per (step, source)
    assert [r["step"] for r in rows] == sorted(r["step"] for r in rows)  # in step order
    per_source, per_step = build_targets(build)
    assert got == {key: k for key, k in per_source.items() if key[0] in steps}  # every (step, source), exactly
    for t in steps:
        mine = [r for r in rows if r["step"] == t]
        assert sum(r["tokens"] for r in mine) == per_step[t]  # Σ tokens = the step's real targets
        assert all(r["loss_sum"] > 0 for r in mine)
        if step_loss is not None:
            mean = sum(r["loss_sum"] for r in mine) / per_step[t]
            assert mean == pytest.approx(step_loss[t], rel=1e-5)
    png = run / log.PLOT_NAME
    assert png.read_bytes()[:8] == PNG_MAGIC if plot else not png.exists()
    return rows
