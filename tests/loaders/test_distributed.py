"""Four real processes (torchrun, gloo, CPU), dp=2 × cp=2: gathered, every step is exactly the build's step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_torchrun_dp2_cp2_reassembles_every_step(tiny_build: Path, tmp_path: Path) -> None:
    out = tmp_path / "verdict.txt"
    script = Path(__file__).with_name("torchrun_check.py")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [*cmd, str(script), str(tiny_build), str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.read_text() == "ok"
