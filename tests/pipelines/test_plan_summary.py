"""``pipelines/plan_summary.py``: what ``weir plan`` shows of a plan. The JSON report is strict JSON (an unbounded
``max_epochs`` is ``null``, never ``Infinity``) whose figures add up (tokens per step, steps per phase, tokens
per phase and per source); the printed plan has one summary line, a row per phase and per source, and every
warning. (The command around it: ``test_cli_plan.py``.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from rich.console import Console

from mixing import Mix, load_mix
from mixing.plan.curriculum_plan import Plan, preview_plan
from pipelines.plan_summary import plan_report, print_plan


def mix_of(tiny_build: Path, tmp_path: Path, edit: tuple[str, str] | None = None) -> Mix:
    text = (tiny_build.parent / "tiny.yaml").read_text()
    (tmp_path / "tiny.yaml").write_text(text.replace(*edit) if edit else text)
    return load_mix(tmp_path / "tiny.yaml")


@pytest.mark.parametrize("unbounded", [False, True], ids=["max_epochs", "no_max_epochs"])
def test_the_json_report_is_strict_json_whose_figures_add_up(tiny_build: Path, tmp_path: Path, unbounded: bool) -> None:
    mix = mix_of(tiny_build, tmp_path, (", max_epochs: 50}", "}") if unbounded else None)
    plan = preview_plan(mix, tiny_build / "weir.duckdb")
    report = json.loads(json.dumps(plan_report(mix, plan, tiny_build), allow_nan=False))  # raises on inf or nan

    assert (report["mix"], report["build"], report["steps"]) == ("tiny", str(tiny_build), mix.total_steps)
    assert report["tokens_per_step"] == report["seq_len"] * report["global_batch"] == 64 * 4
    assert report["units"] == plan.units > 0
    phases, sources = report["phases"], {s["source"]: s for s in report["sources"]}
    assert [p["phase"] for p in phases] == [p.phase for p in mix.curriculum]
    assert sum(p["steps"] for p in phases) == report["steps"]
    assert [p["first_step"] for p in phases] == [sum(p["steps"] for p in phases[:i]) for i in range(len(phases))]
    assert set(sources) == set(mix.sources)
    for p in phases:
        assert p["tokens_planned"] == sum(p[f"tokens_{s}"] for s in sources)
    for s, row in sources.items():
        assert row["tokens_planned"] == sum(p[f"tokens_{s}"] for p in phases)
        assert row["max_epochs"] == (None if unbounded else 50)
    assert report["warnings"] == list(plan.warnings)


def test_the_printed_plan_shows_every_phase_source_and_warning(tiny_build: Path, tmp_path: Path) -> None:
    mix = mix_of(tiny_build, tmp_path)
    plan: Plan = dataclasses.replace(
        preview_plan(mix, tiny_build / "weir.duckdb"), warnings=("source 'qa' is drawn 3 times", "second warning")
    )
    console = Console(record=True, width=400, color_system=None)
    print_plan(console, mix, plan, tiny_build)
    lines = console.export_text().splitlines()
    total = mix.total_steps * 64 * 4
    assert lines[0] == (
        f"mix 'tiny': {mix.total_steps} steps × 4 sequences × 64 tokens = {total:,} tokens; "
        f"{plan.units:,} document pieces drawn (from {tiny_build})"
    )
    for row in plan.phases.iter_rows(named=True):
        last = row["first_step"] + row["steps"] - 1
        assert any(f"{row['first_step']}–{last} ({row['steps']})" in line and row["phase"] in line for line in lines)
    for row in plan.per_source.iter_rows(named=True):
        cells = [f"{row['docs_available']:,}", f"{row['tokens_planned']:,}", f"{row['epochs']:.3f}"]
        assert any(line.startswith(f"│ {row['source']} ") and all(c in line for c in cells) for line in lines)
    assert lines[-2:] == ["warning: source 'qa' is drawn 3 times", "warning: second warning"]
