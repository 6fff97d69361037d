"""``assets/checks.py``: the ``mixture_error`` check passes exactly when the goals that apply are met and says
which applied; on a build whose mix file regroups steps it judges the trainer's stream
(:func:`assets.stream.stream_report`) beside the build's own steps, names both in its one line, and passes or not
on the worse of the two."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg
from hypothesis import given, settings
from hypothesis import strategies as st

from assets.checks import mixture_check, stream_check
from assets.stream import stream_report
from mixing.output.layout import BuildLayout
from mixing.plan.mixture import GOAL_PHASE, GOAL_WINDOW, unit_goal
from mixing.report import inspect_build
from tests.conftest import ROOT, TINY_MIX, write_tiny_sources


def test_the_mixture_error_check_judges_the_trainers_stream(tmp_path: Path) -> None:
    write_tiny_sources(tmp_path / "data")
    mix = TINY_MIX.format(root=tmp_path / "data").replace("steps: 3", "steps: 4").replace("steps: 5", "steps: 6")
    (tmp_path / "m.yaml").write_text(mix + "balance: {regroup: {window: 2, period: 2}}\n")
    subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "build", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "b")],
        check=True, cwd=ROOT, capture_output=True,
    )  # fmt: skip
    layout = BuildLayout.of(tmp_path / "b")
    built, stream = inspect_build(layout).mixture_error, stream_report(layout)
    check = stream_check(layout, built)
    text = check.description or ""
    assert f"build's steps {built.window:.4f} / {built.phase:.4f}" in text
    assert "trainer's stream (regroup window 2, period 2)" in text
    assert f"window {max(built.window, stream.window):.4f}" in text  # the worse of the two is judged
    assert check.metadata["window"].value == max(built.window, stream.window)
    assert (stream.regroup.window, stream.regroup.period) == (2, 2)  # measured under the mix file's settings
    goal = check.metadata["goal_window"]
    assert isinstance(goal, dg.FloatMetadataValue) and goal.value is not None
    assert check.passed == (max(built.window, stream.window) <= goal.value)


SHARES = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=200)
@given(window=SHARES, phase=SHARES, units=st.tuples(SHARES, SHARES), unit=st.sampled_from(["sequence", "document"]))
def test_the_mixture_check_passes_exactly_when_both_goals_that_apply_are_met(
    window: float, phase: float, units: tuple[float, float], unit: str
) -> None:
    check = mixture_check(window, phase, "planned", units, unit)
    goal_w, goal_p = unit_goal(GOAL_WINDOW, units[0]), unit_goal(GOAL_PHASE, units[1])
    assert goal_w >= GOAL_WINDOW and goal_p >= GOAL_PHASE  # a coarse unit only ever relaxes the goal
    assert check.passed == (window <= goal_w and phase <= goal_p)
    assert check.check_name == "mixture_error" and check.severity == dg.AssetCheckSeverity.WARN
    text = check.description or ""
    assert "\n" not in text and text.startswith("planned: ")
    assert f"window {window:.4f}" in text and f"phase {phase:.4f}" in text
    if window > GOAL_WINDOW and units[0] > GOAL_WINDOW:  # the goal that applies is the unit's, and it says why
        assert f"one whole {unit} is that share of a window" in text
    meta = {k: v.value for k, v in check.metadata.items()}
    assert meta == {"window": window, "phase": phase, "goal_window": goal_w, "goal_phase": goal_p}
