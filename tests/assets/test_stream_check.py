"""The Dagster ``mixture_error`` check of ``packed_shards``: on a build whose mix file regroups steps it
judges the trainer's stream (:func:`assets.stream.stream_report`) beside the build's own steps, names both in
its one line, and passes or not on the worse of the two."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from assets.checks import stream_check
from assets.stream import stream_report
from mixing.output.layout import BuildLayout
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
    assert check.passed == (max(built.window, stream.window) <= check.metadata["goal_window"].value)
