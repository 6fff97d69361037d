"""The tiny mix (:func:`tests.conftest.tiny_build`) built with 8 sequences per shard."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_MIX, write_tiny_sources


@pytest.fixture(scope="session")
def sharded_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny mix built with 8 sequences per shard (so that the cache has something to evict)."""
    base = tmp_path_factory.mktemp("sharded")
    write_tiny_sources(base / "data")
    (base / "tiny.yaml").write_text(TINY_MIX.format(root=base / "data"))
    code = (
        "import sys, mixing.pack.packed as p; p._SHARD_TOKENS = 8 * 64; "
        "from pipelines.cli import app; app(sys.argv[1:])"
    )
    out = base / "build"
    subprocess.run(
        [sys.executable, "-c", code, "build", str(base / "tiny.yaml"), "--out", str(out)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    return out
