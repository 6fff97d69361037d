"""``weir build`` for operators: what it prints in a log (full width, stage warnings, missed goals marked,
``--strict``), where its run is recorded (the project's Dagster instance, the one ``weir ui`` shows), and its
figures computed once."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from typer.testing import CliRunner

from contract.shards import ShardSet
from mixing import load_mix
from mixing.report import REPORT, inspect_build, saved_report
from mixing.stages import STAGES
from pipelines import ui
from pipelines.cli import app
from pipelines.instance import dagster_home as project_home
from pipelines.transaction import build_output

ROOT = Path(__file__).resolve().parents[2]
WEIR = [sys.executable, "-m", "pipelines.cli"]


def weir(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WEIR, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def chatty_mix(tiny_mix_path: Path) -> Path:
    """The tiny mix plus a chat source (default chatml template; the bytes tokenizer has no chat markers) and
    a qa record that lacks the template's field ``a``."""
    data = tiny_mix_path.parent / "data"
    chats = [
        {"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "hello"}]}
        for i in range(30)
    ]
    (data / "chat.jsonl").write_text("\n".join(json.dumps(c) for c in chats) + "\n")
    with (data / "qa.jsonl").open("a") as f:
        f.write(json.dumps({"q": "no answer"}) + "\n")
    text = tiny_mix_path.read_text()
    text = text.replace(
        "curriculum:",
        f'  chat:  {{uri: "{data}/chat.jsonl", format: jsonl, messages: messages, max_epochs: 50}}\ncurriculum:',
    )
    text = text.replace("{notes: 0.75, qa: 0.25}", "{notes: 0.5, qa: 0.25, chat: 0.25}")
    text = text.replace("{notes: 0.25, qa: 0.75}", "{notes: 0.25, qa: 0.5, chat: 0.25}")
    mix = tiny_mix_path.with_name("chatty.yaml")
    mix.write_text(text)
    return mix


@pytest.mark.slow
def test_weir_build_prints_warnings_marks_missed_goals_and_records_into_the_project_instance(
    tiny_mix_path: Path, tmp_path: Path, dagster_home: Path
) -> None:
    out = tmp_path / "out"
    mix = chatty_mix(tiny_mix_path)
    r = weir("build", mix, "--out", out, "--strict")
    # the tiny mix misses its goals (8 steps of 4 sequences cannot follow the mixture closely): the build is
    # whole, --strict exits 4 and names them
    assert r.returncode == 4, r.stderr
    assert (out / "shards" / "manifest.json").is_file()
    missed = [line.split()[2] for line in r.stderr.splitlines() if line.startswith("goal missed: ")]
    assert "packing_efficiency" in missed, r.stderr  # 64-token sequences: whole documents leave gaps
    lines = r.stdout.splitlines()
    summary = next(line for line in lines if line.startswith("mix 'tiny':"))
    assert "truncated_docs" in summary, "one line, never wrapped at 80 columns outside a terminal"
    for name in missed:  # each goal named on stderr is marked where the summary prints it
        assert any(name in line and "[goal missed]" in line for line in lines), (name, r.stdout)
    # the documents stage's warnings, which Dagster's silenced console log used to swallow
    assert "warning: source 'chat': chat_template 'chatml' writes <|im_start|>, <|im_end|>" in r.stdout, r.stdout
    assert "warning: source 'qa': 1 of 42 records lack template field 'a'" in r.stdout, r.stdout

    # the run is in the project's instance ($DAGSTER_HOME here; .dagster_home in a checkout), with its checks
    assert dagster_home == Path(os.environ["DAGSTER_HOME"])
    assert f"recorded in the Dagster instance at {dagster_home}" in r.stdout
    instance = dg.DagsterInstance.from_config(str(dagster_home))
    for stage in (s.name for s in STAGES):
        assert instance.get_latest_materialization_event(dg.AssetKey(["tiny", stage])) is not None, stage
    docs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(["tiny", "documents"]), asset_partitions=["chat"]), limit=1
    ).records[0]
    meta = docs.asset_materialization.metadata  # type: ignore[union-attr]
    assert "chat_template 'chatml'" in meta["warnings"].value  # type: ignore[operator]
    check = dg.AssetCheckKey(dg.AssetKey(["tiny", "packed_shards"]), "mixture_error")
    assert instance.get_latest_asset_check_evaluation_record(check) is not None

    # weir inspect marks the same goals; --strict is opt-in
    r = weir("inspect", out)
    assert r.returncode == 0 and "[goal missed]" in r.stdout, r.stdout
    assert weir("inspect", out, "--strict").returncode == 4


def test_weir_ui_opens_the_instance_weir_build_records_into(
    dagster_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert project_home() == dagster_home.resolve()  # what `weir build` records into
    started: list[dict[str, str]] = []

    def run_group(cmd: list[str], env: dict[str, str], *_consoles: object) -> int:  # stands in for `dagster dev`
        started.append(env)  # (a UI per test is slow)
        return 0

    monkeypatch.setattr(ui, "run_group", run_group)
    r = CliRunner().invoke(app, ["ui", "--port", "3999"])
    assert r.exit_code == 0, r.output
    assert started[0]["DAGSTER_HOME"] == str(dagster_home.resolve())


def test_help_is_plain_text_and_lists_every_command() -> None:
    r = weir("--help")
    assert r.returncode == 0
    for command in ("validate", "plan", "build", "inspect", "export-megatron", "demo-data", "ui"):
        assert re.search(rf"Commands:.*\b{command}\b", " ".join(r.stdout.split())), command
    for command in ("", "validate", "plan", "build", "inspect", "export-megatron", "demo-data", "ui"):
        text = weir(*([command] if command else []), "--help").stdout
        assert "``" not in text and ":func:" not in text and ":mod:" not in text, command


def test_tables_are_never_cut_outside_a_terminal(demo_build: Path) -> None:
    r = weir("plan", demo_build.parent / "demo.yaml", "--build", demo_build, "--json")
    assert r.returncode == 0, r.stderr
    phases = json.loads(r.stdout)["phases"]
    r = weir("plan", demo_build.parent / "demo.yaml", "--build", demo_build)
    assert r.returncode == 0, r.stderr
    assert "…" not in r.stdout, r.stdout
    for p in phases:
        row = next(line for line in r.stdout.splitlines() if f" {p['phase']} " in line)
        assert f"{p['tokens_planned']:,}" in row, row


@pytest.mark.slow
def test_a_build_hashes_its_shards_once_and_weir_build_prints_the_saved_figures(
    tiny_mix_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real = ShardSet.file_problems

    def counted(self: ShardSet) -> dict[str, str]:
        calls.append(self.url)
        return real(self)

    monkeypatch.setattr(ShardSet, "file_problems", counted)
    out = tmp_path / "out"
    r = CliRunner().invoke(app, ["build", str(tiny_mix_path), "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert len(calls) == 1, "the packed_shards asset verifies the shards; the CLI summary reads its report"
    report = saved_report(out)
    assert report is not None
    assert report == inspect_build(out)
    assert report.as_json() == json.loads(json.dumps(inspect_build(out).as_json()))
    assert f"{report.tokens:,} tokens" in r.output

    # the saved figures are trusted only while they belong to these shards and are unedited
    saved = json.loads((out / REPORT).read_text())
    saved["report"]["tokens"] += 1
    (out / REPORT).write_text(json.dumps(saved))
    assert saved_report(out) is None
    other = tmp_path / "other.yaml"
    other.write_text(tiny_mix_path.read_text().replace("seed: 7", "seed: 8"))
    build_output(load_mix(other), tmp_path / "other", say=lambda _s: None)
    assert saved_report(tmp_path / "other") is not None
    (out / REPORT).write_bytes((tmp_path / "other" / REPORT).read_bytes())
    assert saved_report(out) is None, "another build's figures"
