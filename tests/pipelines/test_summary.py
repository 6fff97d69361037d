"""``pipelines/summary.py``: what ``weir build`` and ``weir inspect`` say of a build. A goal is listed as missed
exactly when its figure crosses the goal that applies (packing ≥ 0.995, no truncation, ``mixture_error`` per
window and per phase, the trainer's stream); the summary marks each missed goal once with "[goal missed]",
returns the same list, and has a row per source. (The CLI's exit codes and stderr: ``test_operator_output.py``.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from contract.record import Regroup
from mixing.output.layout import BuildLayout
from mixing.report import MIN_PACKING_EFFICIENCY, BuildReport, StreamMixtureReport, inspect_build
from pipelines.summary import missed_goals, print_summary


@pytest.fixture(scope="module")
def report(tiny_build: Path) -> BuildReport:
    return inspect_build(tiny_build)


@pytest.fixture(scope="module")
def regroup(tiny_build: Path) -> Regroup:
    return BuildLayout.of(tiny_build).shard_set().manifest.regrouping


def variant(r: BuildReport, regroup: Regroup, eff: float, trunc: float, window: float, phase: float,
            stream: bool | None) -> BuildReport:  # fmt: skip
    """``r`` with these figures; ``stream``: no stream report (None), or one that meets its goals or not."""
    me = r.mixture_error.model_copy(update={"window": window, "phase": phase})
    st_report = None
    if stream is not None:
        st_report = StreamMixtureReport(**{**me.model_dump(), "ok": stream}, regroup=regroup)
    update = {"packing_efficiency": eff, "truncated_docs": trunc, "mixture_error": me}
    return r.model_copy(update={**update, "mixture_error_stream": st_report})


FIGURES = dict(
    eff=st.floats(0.9, 1.0),
    trunc=st.one_of(st.just(0.0), st.floats(0.0, 0.2)),
    window=st.floats(0.0, 0.1),
    phase=st.floats(0.0, 0.1),
    stream=st.sampled_from([None, True, False]),
)


@settings(max_examples=100)
@given(**FIGURES)
def test_a_goal_is_missed_exactly_when_its_figure_crosses_it(
    report: BuildReport, regroup: Regroup, eff: float, trunc: float, window: float, phase: float, stream: bool | None
) -> None:
    r = variant(report, regroup, eff, trunc, window, phase, stream)
    me = r.mixture_error
    missed = missed_goals(r)
    expected = {
        "packing_efficiency": eff < MIN_PACKING_EFFICIENCY,
        "truncated_docs": trunc > 0,
        "window >": window > me.goal_window,
        "per phase >": phase > me.goal_phase,
        "trainer's stream": stream is False,
    }
    assert len(missed) == sum(expected.values())
    for words, is_missed in expected.items():
        assert any(words in m for m in missed) == is_missed, (words, missed)
    assert all("\n" not in m for m in missed)


@settings(max_examples=25)
@given(**FIGURES)
def test_the_summary_marks_each_missed_goal_once_and_returns_them(
    report: BuildReport, regroup: Regroup, eff: float, trunc: float, window: float, phase: float, stream: bool | None
) -> None:
    r = variant(report, regroup, eff, trunc, window, phase, stream)
    console = Console(record=True, width=100_000, color_system=None)
    missed = print_summary(console, r)
    assert missed == missed_goals(r)
    text = console.export_text()
    assert text.count("[goal missed]") == len(missed)
    lines = text.splitlines()
    assert lines[0].startswith(f"mix 'tiny': {r.steps} steps, {r.sequences} sequences of {r.seq_len} tokens")
    assert f"packing_efficiency {eff:.4f}" in lines[0] and f"truncated_docs {trunc:.4f}" in lines[0]
    assert ("trainer's stream" in text) == (stream is not None)
    for name, s in r.per_source.items():
        share = f"{s.tokens_packed / r.tokens:.3f}"
        assert any(line.startswith(f"│ {name} ") and f"{s.tokens_packed:,}" in line and share in line for line in lines)
