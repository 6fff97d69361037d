"""``{env_NAME}`` in a source URI: the value reaches the files it names and nothing else.

A build whose URI holds ``{env_WEIR_TEST_DATA_TAG}`` (a recognizable value) succeeds, then fails; neither the
CLI's output, nor any file of the build folder (text, json, parquet, duckdb), nor the Dagster instance of an
in-process materialization (its event log records and the files of its storage) holds the value.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg
import duckdb
import polars as pl
import pytest
from dagster._serdes import serialize_value

from contract.errors import WeirError
from mixing import MixError, load_mix
from mixing.mixfile.mix import parse_mix
from pipelines.build import build_mix
from tests.conftest import TINY_MIX, write_tiny_sources

ROOT = Path(__file__).resolve().parents[2]
VAR, SECRET = "WEIR_TEST_DATA_TAG", "s3cr3t-7f3a9c1e"
SHOWN = "{env_WEIR_TEST_DATA_TAG}"


def _mix(tmp_path: Path) -> Path:
    """The tiny mix with its data under ``tmp_path/<SECRET>/``, reached through ``{env_WEIR_TEST_DATA_TAG}``."""
    write_tiny_sources(tmp_path / SECRET)
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY_MIX.format(root=f"{tmp_path}/{SHOWN}"))
    return path


def _leaks(root: Path) -> list[str]:
    """Files under ``root`` holding SECRET: raw bytes, every cell of parquet files and duckdb tables."""
    found = []
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        if f.suffix == ".parquet":
            df = pl.read_parquet(f)
            if any(SECRET in str(v) for col in df.columns for v in df[col].cast(pl.String, strict=False).to_list()):
                found.append(str(f))
        elif f.suffix == ".duckdb":
            with duckdb.connect(str(f), read_only=True) as con:
                for (table,) in con.sql("SELECT table_name FROM duckdb_tables()").fetchall():
                    if any(SECRET in str(row) for row in con.sql(f'SELECT * FROM "{table}"').fetchall()):
                        found.append(f"{f}:{table}")
        if SECRET.encode() in f.read_bytes():
            found.append(str(f))
    return found


@pytest.mark.slow
def test_a_cli_build_shows_no_env_value_when_it_succeeds_or_fails(tmp_path: Path) -> None:
    mix = _mix(tmp_path)
    weir = [sys.executable, "-m", "pipelines.cli", "build", str(mix), "--out", str(tmp_path / "out")]
    env = {**__import__("os").environ, VAR: SECRET}
    ok = subprocess.run(weir, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr[-3000:]
    assert SECRET not in ok.stdout + ok.stderr
    assert _leaks(tmp_path / "out") == []
    # The paths are there in their shown form (and the build read the files through them).
    quarantined = (tmp_path / "out" / "sources" / "qa" / "quarantine.jsonl").read_text()
    assert f"{SHOWN}/qa.jsonl" in quarantined
    index = pl.read_parquet(tmp_path / "out" / "sources" / "notes" / "index.parquet")
    assert index["path"].str.starts_with(f"{tmp_path}/{SHOWN}/notes/").all() and len(index) == 12

    env[VAR] = SECRET + "-moved"  # the data is not there any more: the index finds no file
    failed = subprocess.run(weir, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert failed.returncode == 1
    assert "build failed" in failed.stderr and f"{SHOWN}/notes/*.txt" in failed.stderr, failed.stderr
    assert SECRET not in failed.stdout + failed.stderr
    assert _leaks(tmp_path / "out") == []  # the previous build is untouched and still clean


@pytest.mark.slow
def test_dagster_event_log_and_metadata_hold_no_env_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mix = load_mix(_mix(tmp_path))
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as instance:
        monkeypatch.setenv(VAR, SECRET)
        build_mix(mix, tmp_path / "out", say=lambda _s: None, instance=instance)
        monkeypatch.setenv(VAR, SECRET + "-moved")
        with pytest.raises((dg.DagsterError, WeirError)) as failure:
            build_mix(mix, tmp_path / "out2", say=lambda _s: None, instance=instance)
        assert SECRET not in str(failure.value) + str(getattr(failure.value, "user_exception", ""))
        runs = instance.get_runs()  # one run per build: the one that succeeded, the one that failed
        assert len(runs) == 2 and any(r.status == dg.DagsterRunStatus.FAILURE for r in runs)
        records = [serialize_value(e) for r in runs for e in instance.all_logs(r.run_id)]
        assert any(SHOWN in text for text in records)  # the failure and the quarantine sample name the path
        assert [t for t in records if SECRET in t] == []
        for stage in ("source_index", "documents"):
            event = instance.get_latest_materialization_event(dg.AssetKey(["tiny", stage]))
            assert event is not None and SECRET not in serialize_value(event)  # its metadata
    assert _leaks(home) == [] and _leaks(tmp_path / "out") == []


def test_credentials_and_unknown_placeholders_are_refused_in_a_uri() -> None:
    base = TINY_MIX.format(root="/data")
    for uri, words in [
        ("{env_AWS_SECRET_ACCESS_KEY}/x/*.txt", "looks like a credential"),
        ("{env_HF_TOKEN}/x/*.txt", "looks like a credential"),
        ("{mix_dir.__class__}/x", "unknown placeholder {mix_dir.__class__}"),
        ("{HOME}/x", "unknown placeholder {HOME}"),
    ]:
        with pytest.raises(MixError) as e:
            parse_mix(base.replace("/data/notes/*.txt", uri), "m.yaml")
        assert str(e.value).startswith("m.yaml:6: sources.notes.uri: ") and words in str(e.value), str(e.value)
