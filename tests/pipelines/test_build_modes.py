"""A build's files and folders follow the umask, so a trainer running as another user can read it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WEIR = [sys.executable, "-m", "pipelines.cli"]
NOBODY = 65534


def weir_build(mix: Path, out: Path, umask: int) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [*WEIR, "build", str(mix), "--out", str(out)], capture_output=True, text=True, cwd=ROOT, umask=umask
    )
    assert r.returncode == 0, r.stderr
    return r


def wrong_modes(out: Path, umask: int) -> list[str]:
    """Every file and folder of the build whose mode is not 0666/0777 less ``umask``."""
    bad = []
    for p in [out, *sorted(out.rglob("*"))]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        want = (0o777 if p.is_dir() else 0o666) & ~umask
        if mode != want:
            bad.append(f"{p.relative_to(out.parent)} {mode:o} (want {want:o})")
    return bad


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder every user may enter (pytest's tmp_path is 0700), removed afterwards."""
    d = Path(tempfile.mkdtemp(prefix="weir-modes-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.mark.slow
def test_every_file_and_folder_follows_the_umask_also_when_reusing_a_build(tiny_mix_path: Path, tmp_path: Path) -> None:
    # a trained tokenizer, so tokenizer files (json, spec, sample stamp) are written too
    text = tiny_mix_path.read_text().replace("{kind: bytes}", "{kind: bpe, vocab_size: 300, sample_bytes: 400}")
    tiny_mix_path.write_text(text)
    out = tmp_path / "out"
    weir_build(tiny_mix_path, out, 0o022)
    kinds = {p.suffix for p in out.rglob("*") if p.is_file()}
    assert {".duckdb", ".parquet", ".npz", ".npy", ".json", ".jsonl", ".bin", ".sha256"} <= kinds, kinds
    assert wrong_modes(out, 0o022) == []
    # a rebuild under another umask reuses the tokenizer and chunks of the first: the modes are the new umask's
    weir_build(tiny_mix_path, out, 0o027)
    assert wrong_modes(out, 0o027) == []
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0, reason="reading as the nobody user needs root (to switch users)")
def test_another_user_reads_the_whole_build(tiny_mix_path: Path, shared_dir: Path) -> None:
    out = shared_dir / "out"
    weir_build(tiny_mix_path, out, 0o022)
    # Python, the checkout and its .venv may live where nobody cannot enter (/root, a 0700 home): the reader
    # reads the build once as root, so that every module it imports (lazily ones too) is loaded, then drops to
    # nobody and reads every file, and the whole build, again
    reader = (
        "import encodings.cp437, json, os, pathlib, sys\n"
        "from mixing.report import inspect_build\n"
        "root = pathlib.Path(sys.argv[1])\n"
        "assert not inspect_build(root).corrupt_files\n"
        f"os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})\n"
        "n = sum(len(p.read_bytes()) >= 0 for p in sorted(root.rglob('*')) if p.is_file())\n"
        "report = inspect_build(root)\n"
        "print(json.dumps({'files': n, 'uid': os.getuid(), 'corrupt': report.corrupt_files}))"
    )
    r = subprocess.run([sys.executable, "-c", reader, str(out)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"files": sum(p.is_file() for p in out.rglob("*")), "uid": NOBODY, "corrupt": []}
