"""Four real processes (torchrun, gloo, CPU), dp=2 × cp=2: gathered, every step is exactly the build's step."""

from __future__ import annotations

from pathlib import Path

from tests.loaders.torchrun import run_torchrun


def test_torchrun_dp2_cp2_reassembles_every_step(tiny_build: Path, tmp_path: Path) -> None:
    run_torchrun("torchrun_check.py", 4, tiny_build, tmp_path)
