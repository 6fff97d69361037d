"""A tiny build (bytes tokenizer, S=64, 4 sequences per step, 8 steps in two phases), built once per session."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_MIX, write_tiny_sources


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("tiny")
    write_tiny_sources(base / "data")
    (base / "tiny.yaml").write_text(TINY_MIX.format(root=base / "data"))
    out = base / "build"
    subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "build", str(base / "tiny.yaml"), "--out", str(out)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    return out
