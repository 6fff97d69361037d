"""The length_stats and plan assets: plots in their metadata, and the plan's asset checks."""

from __future__ import annotations

import base64
from pathlib import Path

import dagster as dg
import polars as pl

from assets import WeirEngine, WeirStorage, mix_assets
from assets.plots import length_histogram_md, mixture_area_md
from mixing import load_mix
from mixing.plan.mixture import GOAL_PHASE, GOAL_WINDOW, goal_text, plan_mixture_error
from mixing.stages import stages_until

PNG = b"\x89PNG\r\n\x1a\n"


def png_of(md: str) -> bytes:
    assert md.startswith("![") and "](data:image/png;base64," in md, md[:80]
    return base64.b64decode(md.split("base64,", 1)[1].rstrip(")"))


def test_plots_are_png_data_uris() -> None:
    hist = pl.DataFrame(
        {
            "source": ["a", "a", "b", "*"],
            "lo": [1, 2, 4, 1],
            "hi": [2, 4, 8, 2],
            "docs": [3, 1, 2, 6],
            "tokens": [3, 2, 10, 15],
        }
    )
    assert png_of(length_histogram_md(hist, seq_len=4)).startswith(PNG)
    quotas = pl.DataFrame(
        {
            "step": [0, 0, 1, 1, 2, 2],
            "phase": ["p", "p", "p", "p", "q", "q"],
            "source": ["a", "b"] * 3,
            "quota": [10, 0, 7, 3, 0, 10],
        }
    )
    assert png_of(mixture_area_md(quotas)).startswith(PNG)


def test_plan_asset_checks_pass_and_metadata_has_plots(tiny_mix_path: Path, tmp_path: Path) -> None:
    mix = load_mix(tiny_mix_path)
    defs = mix_assets(mix)
    resources = {"storage": WeirStorage(root=str(tmp_path / "build"), per_mix=False), "engine": WeirEngine()}
    instance = dg.DagsterInstance.ephemeral()

    def run(stage: str, partition: str | None = None) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            defs,
            selection=[dg.AssetKey([mix.name, stage])],
            partition_key=partition,
            resources=resources,
            instance=instance,
        )

    for stage in stages_until("length_stats"):
        for part in stage.partitions(mix):
            result = run(stage.name, part)
    stats_meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert png_of(stats_meta["histogram"].value).startswith(PNG)  # type: ignore[arg-type]
    result = run("plan")
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert png_of(meta["mixture"].value).startswith(PNG)  # type: ignore[arg-type]
    assert "| phase |" in meta["phases"].value  # type: ignore[operator]
    checks = {c.check_name: c for c in result.get_asset_check_evaluations()}
    assert set(checks) == {"mixture_error", "planned_documents_exist", "token_budget_per_phase"}
    assert checks["planned_documents_exist"].passed
    assert checks["token_budget_per_phase"].passed
    # the tiny mix has 4 sequences of 64 tokens per step: whole documents may allow less than the goals, and
    # the check judges the plan by what they allow, saying so where it decides (test_mixture.py has both wordings)
    (db,) = (tmp_path / "build").rglob("weir.duckdb")
    me = plan_mixture_error(db)
    assert me.unit_window > GOAL_WINDOW and me.unit_phase > GOAL_PHASE  # the regime this test is about
    window = goal_text(GOAL_WINDOW, me.unit_window, me.window, "a window", "document")
    phase = goal_text(GOAL_PHASE, me.unit_phase, me.phase, "the smallest phase", "document")
    expected = f"planned: window {me.window:.4f} (goal {window}), phase {me.phase:.4f} (goal {phase})"
    assert checks["mixture_error"].description == expected and checks["mixture_error"].passed == me.ok
