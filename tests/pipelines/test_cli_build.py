"""``pipelines/cli_build.py``: ``weir build`` from the command line. An invalid mix or continuation flag is one line
and exit 2 before any work, a failed build leaves no partial output (only its work cache), and the build prints
every warning ``weir plan`` prints, in the same words."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.pipelines.cli_helpers import ROOT, weir


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        (
            ("mixture: {prose: 0.7, code: 0.2, qa: 0.1}", "mixture: {prose: 0.7, code: 0.2, web: 0.1}"),
            "unknown source 'web'",
        ),
        (
            ("mixture: {prose: 0.7, code: 0.2, qa: 0.1}", "mixture: {prose: 0.7, code: 0.2, qa: 0.2}"),
            "sum to 1",
        ),
        (  # said as it is, not read as rich markup
            ("mixture: {prose: 0.7, code: 0.2, qa: 0.1}", 'mixture: {prose: 0.7, code: 0.2, "[/]": 0.1}'),
            "unknown source '[/]'",
        ),
        (("steps: 8,", "steps: -8,"), "greater than 0"),
        (("sequence: {length: 2048, global_batch: 16}", ""), "sequence: field required"),
        (("name: demo", "name: [demo"), "YAML syntax error"),
    ],
)
def test_invalid_mix_fails_build_without_output(tmp_path: Path, edit: tuple[str, str], expect: str) -> None:
    text = (ROOT / "mixes" / "demo.yaml").read_text()
    assert edit[0] in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(*edit))
    out = tmp_path / "out"
    r = weir("build", str(bad), "--out", str(out))
    assert r.returncode == 2
    msg = " ".join(r.stderr.split())
    assert f"{bad}:" in msg and expect in msg, msg
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [bad]
    assert weir("validate", str(bad)).returncode == 2


def test_failed_build_keeps_no_partial_output(tiny_mix_path: Path, tmp_path: Path) -> None:
    text = tiny_mix_path.read_text().replace("max_epochs: 50}", "max_epochs: 1}")
    bad = tmp_path / "short.yaml"
    bad.write_text(text)
    out = tmp_path / "out"
    r = weir("build", str(bad), "--out", str(out))
    assert r.returncode == 1
    assert "runs out" in r.stderr
    assert not out.exists()
    # only the hidden work cache is left (its tokenized documents, no shards), for the next build to reuse
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == [".out.cache"]
    assert not (tmp_path / ".out.cache" / "shards").exists()


def test_build_prints_every_warning_weir_plan_prints_in_the_same_words(tiny_mix_path: Path, tmp_path: Path) -> None:
    """qa without max_epochs is drawn more than once: ``weir plan`` warns about it, and so does the build."""
    text = tiny_mix_path.read_text()
    assert 'A: {a}", max_epochs: 50}' in text
    mix = tmp_path / "uncapped.yaml"
    mix.write_text(text.replace('A: {a}", max_epochs: 50}', 'A: {a}"}'))
    out = tmp_path / "out"
    built = weir("build", str(mix), "--out", str(out))
    assert built.returncode == 0, built.stderr
    planned = weir("plan", str(mix), "--build", str(out))
    assert planned.returncode == 0, planned.stderr
    warnings = [line for line in planned.stdout.splitlines() if line.startswith("warning: ")]
    repeated = r"warning: source 'qa' is repeated \d\.\d\d times \(no max_epochs caps it\)"
    assert any(re.fullmatch(repeated, w) for w in warnings), planned.stdout
    said = [line.strip() for line in built.stdout.splitlines()]
    for w in warnings:
        assert w in said, (w, built.stdout)


def test_build_continuation_flags_are_checked_in_one_line_before_building(tiny_mix_path: Path, tmp_path: Path) -> None:
    """--continue without --at, --feedback without a continuation, an --at past the run: exit 2, one line, nothing
    built. (Continuations themselves: tests/mixing/test_continuation.py.)"""
    log = tmp_path / "losses.csv"
    log.write_text("step,source,loss_sum,tokens\n0,notes,1.0,10\n")
    out = tmp_path / "out"
    bad = tmp_path / "bad.csv"  # rich markup in a row is said as it is, not read as markup
    bad.write_text("step,source,loss_sum,tokens\n0,[/],abc,10\n")
    for flags, said in (
        (["--continue", str(tmp_path), "--at", "3", "--feedback", str(bad)], "'source': '[/]'"),
        (["--continue", str(tmp_path)], "--continue and --at go together"),
        (["--feedback", str(log)], "--feedback reweights a continuation"),
        (["--continue", str(tmp_path), "--at", "99"], "step 99 is not before the run's end"),
    ):
        r = weir("build", str(tiny_mix_path), "--out", str(out), *flags)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not out.exists()


def test_build_with_feedback_prints_the_factors_and_weights_and_records_them(
    tiny_mix_path: Path, tmp_path: Path
) -> None:
    """A continuation at the second phase with --feedback --policy scaling_law: notes' loss still falls, qa's is
    flat, so notes is drawn twice and qa half as much (the bounds), printed and recorded in the manifest."""
    base = tmp_path / "base"
    assert weir("build", str(tiny_mix_path), "--out", str(base)).returncode == 0
    log = tmp_path / "losses.csv"
    rows = [f"{t},notes,{(1.0 + 8.0 * (100 * (t + 1)) ** -0.5) * 100!r},100\n{t},qa,250.0,100" for t in range(3)]
    log.write_text("step,source,loss_sum,tokens\n" + "\n".join(rows) + "\n")
    out = tmp_path / "next"
    flags = ["--continue", str(base), "--at", "3", "--feedback", str(log), "--policy", "scaling_law"]
    r = weir("build", str(tiny_mix_path), "--out", str(out), *flags)
    assert r.returncode == 0, r.stderr
    said = [line.strip() for line in r.stdout.splitlines()]
    assert "feedback (scaling_law): factors notes 2.0000, qa 0.5000 (steps 0..2)" in said, r.stdout
    assert "feedback (scaling_law): phase 'second' weights notes 0.5714, qa 0.4286" in said, r.stdout
    manifest = json.loads((out / "shards" / "manifest.json").read_text())
    note = manifest["lineage"][-1]["feedback"]
    assert note["policy"] == "scaling_law" and note["factor"] == {"notes": 2.0, "qa": 0.5}
    assert note["weights"] == {"second": {"notes": 0.571429, "qa": 0.428571}}
    shown = weir("inspect", str(out))
    assert shown.returncode == 0, shown.stderr
    assert re.search(
        r"weights from step 3 by feedback \(scaling_law, losses of steps 0\.\.2, log sha256 [0-9a-f]{12}…\): "
        r"factors notes 2\.0000, qa 0\.5000",
        shown.stdout,
    ), shown.stdout
