"""``pipelines/diff.py`` and ``weir diff``: where two builds' steps part, from recorded digests, or recomputed for a
build that recorded none (and said so); a damaged build is one line and exit 1."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

from contract.manifest import MANIFEST, write_manifest
from contract.shards import ShardSet
from pipelines.diff import diff_builds, open_shards

ROOT = Path(__file__).resolve().parents[2]


def _edited(tiny_build: Path, tmp_path: Path, step: int) -> Path:
    """A copy of the build whose step ``step`` has one real token changed (manifest resealed, no digests)."""
    copy = tmp_path / "edited"
    shutil.copytree(tiny_build, copy)
    shards = ShardSet(copy / "shards")
    seq = int(np.searchsorted(shards.steps, step))
    k = max(i for i, s in enumerate(shards.manifest.shards) if s.first_sequence <= seq)
    path = copy / "shards" / shards.manifest.shards[k].files.tokens.name
    tokens = np.load(path)
    tokens[seq - shards.manifest.shards[k].first_sequence, 0] += 1
    np.save(path, tokens)
    m = json.loads((copy / "shards" / MANIFEST).read_text())
    m.pop("step_digests")  # as a build made before digests were recorded
    write_manifest(copy / "shards", m)
    return copy


def test_the_first_differing_step_is_found(tiny_build: Path, tmp_path: Path) -> None:
    same = diff_builds(open_shards(str(tiny_build)), open_shards(str(tiny_build / "shards")))
    assert same.first_difference is None and same.identical == 8 and same.lines()[0].startswith("identical")
    d = diff_builds(open_shards(str(tiny_build)), open_shards(str(_edited(tiny_build, tmp_path, 5))))
    assert (d.identical, d.first_difference, d.recomputed) == (5, 5, ("B",))
    assert d.lines()[:2] == ["steps 0..4 identical (5 digests)", "first difference at step 5"]


def test_weir_diff_prints_json_and_refuses_a_damaged_build_in_one_line(tiny_build: Path, tmp_path: Path) -> None:
    weir = [sys.executable, "-m", "pipelines.cli", "diff"]
    got = subprocess.run([*weir, str(tiny_build), str(tiny_build), "--json"], capture_output=True, text=True, cwd=ROOT)
    assert got.returncode == 0 and json.loads(got.stdout)["identical_steps"] == 8
    bad = tmp_path / "bad"
    shutil.copytree(tiny_build, bad)
    (bad / "shards" / MANIFEST).write_text("{")
    got = subprocess.run([*weir, str(tiny_build), str(bad)], capture_output=True, text=True, cwd=ROOT)
    assert got.returncode == 1 and len(got.stderr.strip().splitlines()) == 1 and "not valid JSON" in got.stderr
