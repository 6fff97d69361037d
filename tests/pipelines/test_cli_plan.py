"""``weir plan``: the plan of a mix from an existing build's stats, as a table or JSON, writing nothing."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WEIR = [sys.executable, "-m", "pipelines.cli"]


def weir(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WEIR, *args], capture_output=True, text=True, cwd=ROOT)


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
