"""``pipelines/transaction.py``: ``weir build`` as a transaction. A killed build is cleaned up by the next one (its
tokenized work kept: ``test_kept_work.py``), a build killed between its two renames gets its previous output
back, and two builds never share an output (the lock itself: ``test_output_lock.py``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from mixing import load_mix
from mixing.report import inspect_build
from pipelines.transaction import build_output

ROOT = Path(__file__).resolve().parents[2]
WEIR = [sys.executable, "-m", "pipelines.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def start(mix: Path, out: Path, *flags: str, stdout: int | Path = subprocess.PIPE) -> subprocess.Popen[str]:
    sink = stdout.open("w") if isinstance(stdout, Path) else stdout
    return subprocess.Popen(
        [*WEIR, "build", str(mix), "--out", str(out), *flags],
        stdout=sink,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=ENV,
    )


def wait_for(cond: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def files_in(d: Path) -> int:
    return sum(1 for p in d.rglob("*") if p.is_file()) if d.is_dir() else 0


def beside(out: Path) -> set[str]:
    return {p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}") or p.name == out.name}


def manifest(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((out / "shards" / "manifest.json").read_text())


@pytest.mark.slow
def test_a_build_killed_mid_way_is_cleaned_up_by_the_next_and_the_output_equals_a_clean_build(
    tiny_mix_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    p = start(tiny_mix_path, out)
    stage = out.with_name(f".out.building-{p.pid}")
    try:
        wait_for(lambda: files_in(stage / "sources") > 0 or p.poll() is not None, "the build's staging folder")
        p.send_signal(signal.SIGKILL)
    finally:
        p.kill()
        p.communicate()
    assert files_in(stage) > 0, "the kill came mid-build and left its staging folder"
    assert not out.exists()

    r = subprocess.run(
        [*WEIR, "build", str(tiny_mix_path), "--out", str(out)], capture_output=True, text=True, cwd=ROOT
    )
    assert r.returncode == 0, r.stderr
    # its staging folder is removed, or kept as the work cache when a chunk was complete (test_kept_work.py)
    assert "removed 1 leftover of killed builds (" in r.stdout or "kept the tokenized work of a killed" in r.stdout
    assert beside(out) == {"out"}
    clean = build_output(load_mix(tiny_mix_path), tmp_path / "clean", say=lambda _s: None)
    assert clean.leftovers == 0
    assert isinstance(clean.dest, Path)  # a local build's folder
    assert manifest(out) == manifest(clean.dest)


@pytest.mark.slow
def test_a_build_killed_between_its_two_renames_gets_its_previous_output_back(
    tiny_mix_path: Path, tmp_path: Path
) -> None:
    said: list[str] = []
    mix, out = load_mix(tiny_mix_path), tmp_path / "out"
    build_output(mix, out, say=lambda _s: None)
    before = manifest(out)
    chunk = next((out / "sources" / "notes" / "chunks").rglob("tokens.bin"))
    inode = chunk.stat().st_ino
    # what `kill -9` between `out -> .out.old-<pid>` and `.out.building-<pid> -> out` leaves
    out.rename(out.with_name(".out.old-4000001"))
    (out.with_name(".out.building-4000001") / "shards").mkdir(parents=True)
    (out.with_name(".out.building-4000001") / "shards" / "shard-00000.tokens.npy").write_bytes(b"x" * 100)

    result = build_output(mix, out, say=said.append)
    assert any(s.startswith(f"restored {out} from .out.old-4000001") for s in said), said
    assert "removed 1 leftover of killed builds (100 B)" in said
    assert (result.leftovers, result.leftover_bytes) == (1, 100)
    assert beside(out) == {"out"}
    assert manifest(out) == before
    assert (out / chunk.relative_to(out)).stat().st_ino == inode, "the restored output's chunks were reused"


@pytest.mark.slow
def test_a_second_build_into_the_same_output_stops_naming_the_first_or_waits_for_it(
    tiny_mix_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    first = start(tiny_mix_path, out)
    waiter: subprocess.Popen[str] | None = None
    try:
        stage = out.with_name(f".out.building-{first.pid}")
        wait_for(lambda: stage.is_dir() or first.poll() is not None, "the first build's staging folder")
        first.send_signal(signal.SIGSTOP)  # the first build holds the lock for as long as this test needs

        second = subprocess.run(
            [*WEIR, "build", str(tiny_mix_path), "--out", str(out)], capture_output=True, text=True, cwd=ROOT
        )
        assert second.returncode == 3, second.stderr
        assert f"{out.resolve()}: another weir build (pid {first.pid}) is building into this folder" in second.stderr
        assert "--wait" in second.stderr

        log = tmp_path / "waiter.log"
        waiter = start(tiny_mix_path, out, "--wait", stdout=log)
        wait_for(lambda: f"waiting for the build of pid {first.pid}" in log.read_text(), "the --wait build to wait")
        assert waiter.poll() is None
        first.send_signal(signal.SIGCONT)

        assert first.wait(60) == 0, first.communicate()[1]
        assert waiter.wait(60) == 0, waiter.communicate()[1]
    finally:
        for p in (first, waiter):
            if p is not None:
                p.kill()
                p.communicate()
    assert beside(out) == {"out"}
    assert inspect_build(out).corrupt_files == ()
    assert inspect_build(out).steps == load_mix(tiny_mix_path).total_steps
