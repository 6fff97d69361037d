"""``pipelines/cli_plan.py``: ``weir plan``, the plan of a mix from an existing build's stats, as a table or JSON,
writing nothing; an infeasible one refused in one line, in seconds and bounded memory however many steps it asks for.
``weir validate``: the everyday mistakes of a mix file, in seconds, one line each (exit 2)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.pipelines.cli_helpers import ROOT, tiny_mix, weir, weir_in


def digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_plan_needs_stats_then_computes_them(tiny_mix_path: Path, tmp_path: Path) -> None:
    build = tmp_path / "b"
    r = weir("plan", str(tiny_mix_path), "--build", str(build))
    assert r.returncode == 1
    assert "no length statistics" in r.stderr and "weir build" in r.stderr and "--compute" in r.stderr
    assert not (build / "weir.duckdb").exists()

    r = weir("plan", str(tiny_mix_path), "--build", str(build), "--compute", "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["steps"] == 8 and report["tokens_per_step"] == 256
    assert [p["phase"] for p in report["phases"]] == ["first", "second"]
    assert [p["steps"] for p in report["phases"]] == [3, 5]
    by_src = {s["source"]: s for s in report["sources"]}
    assert set(by_src) == {"notes", "qa"}
    assert sum(p["tokens_planned"] for p in report["phases"]) == sum(s["tokens_planned"] for s in by_src.values())
    for s in by_src.values():
        assert abs(s["epochs"] - s["tokens_drawn"] / s["tokens_available"]) < 1e-9
    assert not (build / "shards").exists()  # stats only: nothing was packed

    # the stats exist now: the table comes from them and the database is left as it was
    before = digest(build / "weir.duckdb")
    r = weir("plan", str(tiny_mix_path), "--build", str(build))
    assert r.returncode == 0, r.stderr
    for words in ("phases", "first", "second", "notes", "qa", "epochs", "max_epochs"):
        assert words in r.stdout, r.stdout
    assert digest(build / "weir.duckdb") == before


def test_infeasible_plan_is_one_message(tiny_mix_path: Path, tmp_path: Path) -> None:
    build = tmp_path / "b"
    assert weir("plan", str(tiny_mix_path), "--build", str(build), "--compute").returncode == 0
    capped = tiny_mix_path.read_text().replace("max_epochs: 50", "max_epochs: 1")
    mix = tmp_path / "capped.yaml"
    mix.write_text(capped)
    r = weir("plan", str(mix), "--build", str(build))
    assert r.returncode == 1
    assert "plan infeasible" in r.stderr and "source 'qa' runs out in phase" in r.stderr
    assert "Traceback" not in r.stderr


# `weir plan` run in-process by a child, which records its peak RSS (ru_maxrss, KiB) after importing what the
# command imports and at the end, and the seconds the command took: the first is the floor of any `weir plan`
# (dagster and the rest), the difference what planning cost.
PROBE = """\
import json, resource, sys, time
import mixing.plan.curriculum_plan, pipelines.cli, pipelines.freshness, pipelines.plan_summary, pipelines.resources
imported = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0 = time.perf_counter()
try:
    pipelines.cli.app(sys.argv[2:], prog_name="weir")
finally:
    figures = {"imported_kib": imported, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
               "seconds": time.perf_counter() - t0}
    open(sys.argv[1], "w").write(json.dumps(figures))
"""


def test_a_phase_of_50b_tokens_on_a_tiny_build_is_refused_in_seconds_in_bounded_memory(
    tiny_build: Path, tmp_path: Path
) -> None:
    """The feasibility is known from the documents' token counts before any step is made: the uncapped qa, which
    a draw would repeat for ever, is never drawn, and 7.8 M steps make no per-step array."""
    text = (tiny_build.parent / "tiny.yaml").read_text()
    for old, new in [
        ("global_batch: 4", "global_batch: 100"),  # 6,400 tokens a step: 50 B tokens are 7,812,500 steps
        ('A: {a}", max_epochs: 50}', 'A: {a}"}'),  # qa: no max_epochs
        ("steps: 5,", "tokens: 50B,"),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    mix = tmp_path / "huge.yaml"
    mix.write_text(text)
    figures = tmp_path / "figures.json"
    try:
        r = subprocess.run(
            [sys.executable, "-c", PROBE, str(figures), "plan", str(mix), "--build", str(tiny_build)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("weir plan did not refuse a 50 B-token phase within 60 s")
    assert (r.returncode, r.stdout) == (1, ""), r.stdout + r.stderr
    line = re.fullmatch(
        r"plan infeasible: source 'notes' runs out in phase 'second': the plan needs (\d+) tokens of it "
        r"\(\d+\.\d\d epochs\) but it has (\d+) tokens and max_epochs is 50 \((\d+) tokens at most\)\n",
        r.stderr,
    )
    assert line, r.stderr
    assert int(line[1]) == 3 * 6400 * 3 // 4 + 50 * 10**9 // 4  # first phase's 3 steps, then a quarter of 50 B
    assert int(line[3]) == 50 * int(line[2])
    f = json.loads(figures.read_text())
    planning_mib = (f["peak_kib"] - f["imported_kib"]) / 1024
    assert f["seconds"] < 15 and planning_mib < 150, f


# --- weir validate: the everyday mistakes, in seconds, one line each (exit 2) ----------------------------


def test_validate_a_valid_mix_prints_its_one_line_from_any_current_directory(tmp_path: Path) -> None:
    mix = tiny_mix(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    r = weir_in(tmp_path / "elsewhere", "validate", str(mix))  # tokenizer.path and the uris: from the mix's folder
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == f"{mix}: ok — mix 'tiny', 2 sources, 2 phases, 8 steps of 4×64 tokens\n"


@pytest.mark.parametrize(
    ("edit", "line", "words"),
    [
        (("notes/*.txt", "notes/*.md"), 6, "sources.notes.uri: no file matches '{cfg}/data/notes/*.md'"),
        (("tok/tokenizer.json", "tok/tokenizer.jsn"), 3, "tokenizer.path: no such file '{cfg}/tok/tokenizer.jsn'"),
        (
            ("data/qa.jsonl", "{{mix_dir}}/data/qa.jsonl"),
            7,
            "sources.qa.uri: expanding it leaves the placeholder {mix_dir}",
        ),
        (
            ("data/notes", "{env_WEIR_TEST_UNSET}/notes"),
            6,
            "sources.notes.uri: environment variable WEIR_TEST_UNSET is not set",
        ),
        (
            ("max_epochs: 50", "max_epoch: 50"),
            6,
            "sources.notes.max_epoch: unknown field 'max_epoch'; did you mean 'max_epochs'?",
        ),
    ],
)
def test_validate_names_each_mistake_in_one_line(tmp_path: Path, edit: tuple[str, str], line: int, words: str) -> None:
    mix = tiny_mix(tmp_path, edit)
    r = weir_in(tmp_path, "validate", str(mix), env={k: v for k, v in os.environ.items() if k != "WEIR_TEST_UNSET"})
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    words = words.replace("{cfg}", str(mix.parent))
    assert r.stderr.startswith(f"invalid mix file: {mix}:{line}: {words}"), r.stderr


def test_validate_notes_an_s3_source_it_cannot_list(tmp_path: Path) -> None:
    mix = tiny_mix(tmp_path, ("data/qa.jsonl", "s3://corpus/qa.jsonl"))
    r = weir_in(tmp_path, "validate", str(mix), env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")})
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{mix}: ok — mix 'tiny', 2 sources, 2 phases, 8 steps of 4×64 tokens\n"
    assert r.stderr.startswith(f"note: {mix}:7: sources.qa.uri: not checked: 's3://corpus/qa.jsonl' is in object"), (
        r.stderr
    )
    assert r.stderr.count("\n") == 1, r.stderr
