"""What the ``weir`` command tests share: the command run as a child (``python -m pipelines.cli``, the way an
operator runs it, from the checkout or any folder) and the tiny mix written with a tokenizer file of its own."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import TINY_MIX, write_tiny_sources

__all__ = ["ROOT", "WEIR", "tiny_mix", "weir", "weir_in"]

ROOT = Path(__file__).resolve().parents[2]
WEIR = [sys.executable, "-m", "pipelines.cli"]


def weir(*args: str) -> subprocess.CompletedProcess[str]:
    """``weir ARGS`` run from the checkout's root; its output as text."""
    return subprocess.run([*WEIR, *args], capture_output=True, text=True, cwd=ROOT)


def weir_in(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``weir ARGS`` run from ``cwd`` (with ``env`` in place of this process's environment, if given)."""
    return subprocess.run([*WEIR, *args], capture_output=True, text=True, cwd=cwd, env=env)


def tiny_mix(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """The tiny mix in ``tmp_path/cfg``, its sources and an hf tokenizer file given relative to that folder."""
    cfg = tmp_path / "cfg"
    write_tiny_sources(cfg / "data")
    (cfg / "tok").mkdir()
    (cfg / "tok" / "tokenizer.json").write_text("{}")  # validate checks that it is readable, not what it holds
    text = TINY_MIX.format(root="data").replace(
        "{kind: bytes}", '{kind: hf, path: tok/tokenizer.json, eos_token: "</s>"}'
    )
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    (cfg / "tiny.yaml").write_text(text)
    return cfg / "tiny.yaml"
