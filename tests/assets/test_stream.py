"""``assets/stream.py``: the trainer's stream judged against the plan. Without ``balance.regroup`` the stream's
steps are the build's own, so its ``mixture_error`` is the build's, measured under the recorded regroup; the
report is the same whichever way the build is named, and reading it changes nothing. (A regrouped build, and
the Dagster check that judges both: ``test_checks.py``.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

from assets.stream import stream_report
from mixing.output.layout import BuildLayout
from mixing.report import StreamMixtureReport, inspect_build


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def test_without_regroup_the_stream_is_the_builds_own_steps(tiny_build: Path) -> None:
    before = digests(tiny_build)
    report = stream_report(tiny_build)
    assert isinstance(report, StreamMixtureReport)
    regroup = BuildLayout.of(tiny_build).shard_set().manifest.regrouping
    assert report.regroup == regroup and regroup.window <= 1, "measured under what the manifest records"
    built = inspect_build(tiny_build).mixture_error
    assert report.model_dump(exclude={"regroup"}) == built.model_dump()
    assert 0 <= report.window <= 1 and 0 <= report.phase <= 1
    assert report.ok == (report.window <= report.goal_window and report.phase <= report.goal_phase)

    same = [stream_report(str(tiny_build)), stream_report(BuildLayout.of(tiny_build))]
    assert all(r == report for r in same), "a str, a Path or a layout: one build, one report"
    assert digests(tiny_build) == before, "the build is only read"
