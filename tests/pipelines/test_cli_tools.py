"""``pipelines/cli_tools.py``: the tools around builds, in-process. ``weir demo-data`` writes the demo corpora where
``--out`` says and prints their counts; ``weir export-megatron`` writes from a build folder what
:func:`mixing.output.megatron.export_megatron` writes, and refuses a bad ``--unit`` (2) or a folder that is no build
(1) in one line; ``weir ui`` serves the instance ``--home`` names and exits with the UI's status. (``weir calibrate``:
tests/pipelines/test_calibrate.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from contract.shards import ShardSet
from mixing.output.megatron import export_megatron, summary
from pipelines import ui
from pipelines.cli import app


def test_demo_data_writes_the_corpora_where_out_says_and_prints_their_counts(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    r = CliRunner().invoke(app, ["demo-data", "--out", str(data)])
    assert r.exit_code == 0, r.output
    assert r.stdout == f"demo data in {data}: {{'prose_files': 1500, 'qa_files': 3}}\n"
    assert len(list((data / "prose").glob("*.txt"))) == 1500 and len(list((data / "qa").glob("*.jsonl"))) == 3


def test_export_megatron_writes_what_the_exporter_writes_from_a_build_folder(tiny_build: Path, tmp_path: Path) -> None:
    direct = export_megatron(ShardSet(tiny_build / "shards"), tmp_path / "direct", "sequence")
    r = CliRunner().invoke(app, ["export-megatron", str(tiny_build), str(tmp_path / "cli"), "--unit", "sequence"])
    assert r.exit_code == 0, r.output
    assert r.stdout == summary({**direct, "prefix": str(tmp_path / "cli")}) + "\n"  # its one line, unwrapped
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"cli{ext}").read_bytes() == (tmp_path / f"direct{ext}").read_bytes(), ext


def test_export_megatron_refuses_a_bad_unit_and_a_folder_that_is_no_build_in_one_line(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["export-megatron", str(tmp_path), str(tmp_path / "out"), "--unit", "token"])
    assert (r.exit_code, r.stdout) == (2, ""), r.output
    assert r.stderr == "--unit must be segment or sequence, not 'token'\n"
    r = CliRunner().invoke(app, ["export-megatron", str(tmp_path), str(tmp_path / "out")])
    assert (r.exit_code, r.stdout) == (1, ""), r.output
    assert r.stderr.startswith("not a build: ") and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_ui_serves_the_instance_home_names_and_exits_with_its_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[tuple[int, Path]] = []

    def dagster_dev(port: int, home: Path, *_consoles: object) -> int:  # stands in for `dagster dev` (slow)
        served.append((port, home))
        return 3

    monkeypatch.setattr(ui, "dagster_dev", dagster_dev)
    home = tmp_path / "home"
    r = CliRunner().invoke(app, ["ui", "--port", "3999", "--home", str(home)])
    assert r.exit_code == 3, r.output
    assert served == [(3999, home.resolve())]
    assert (home / "dagster.yaml").is_file()  # an instance made for it, telemetry off
    assert r.stdout == f"Dagster UI on http://127.0.0.1:3999 (DAGSTER_HOME={home.resolve()}); Ctrl-C stops it\n"
