"""Running a check script under ``torchrun --standalone`` (gloo on CPU) for the multi-rank tests: the script gets
the build and a verdict file, and writes ``ok`` there when every rank agreed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

__all__ = ["run_torchrun"]


def run_torchrun(script: str, nproc: int, build: Path, tmp_path: Path) -> None:
    """Run ``tests/loaders/<script>`` on ``nproc`` local ranks over ``build``; fail with its stderr unless it
    exits 0 and writes the verdict ``ok``."""
    out = tmp_path / "verdict.txt"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [*cmd, str(Path(__file__).with_name(script)), str(build), str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text() == "ok"
