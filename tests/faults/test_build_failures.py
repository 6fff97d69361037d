"""Every failure a ``weir build`` user can meet ends in one ``build failed: …`` line, and none hangs.

Real components throughout: ``weir build`` of the tiny mix as a subprocess into a tmpfs made full (``size=``),
out of inodes (``nr_inodes=``) or read-only, or a folder ``chmod``-ed read-only (as root, written by a build run
without CAP_DAC_OVERRIDE); a real one-node Ray cluster on
127.0.0.1 whose processes are killed before and during the build; and the build under an address-space limit
(RLIMIT_AS) of several sizes. Each failure: exit 1, exactly one ``build failed:`` line naming the path, no
traceback (``--debug`` adds it). A full disk and a disk out of inodes are then given room, and the next build
succeeds, reusing the work the failed one kept.

Mounting a tmpfs needs root (CAP_SYS_ADMIN): those tests skip, saying so, where ``mount`` is refused.
"""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_MIX, write_tiny_sources
from tests.ray_cluster import LocalRayCluster

TIMEOUT_S = 300  # a build that has not ended by then has hung: the test fails on the subprocess's timeout


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    write_tiny_sources(tmp_path / "data")
    (tmp_path / "tiny.yaml").write_text(TINY_MIX.format(root=tmp_path / "data"))
    return tmp_path / "tiny.yaml"


def weir_build(
    mix: Path, out: Path, *args: str, limit_mb: int | None = None, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``weir build MIX --out OUT ARGS`` as a user runs it; under ``ulimit -v limit_mb`` when given, run by the
    command ``prefix`` when given."""

    def limit() -> None:
        if limit_mb is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_mb << 20, resource.getrlimit(resource.RLIMIT_AS)[1]))

    cmd = [*prefix, sys.executable, "-m", "pipelines.cli", "build", str(mix), "--out", str(out), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT_S, preexec_fn=limit)


def failed_line(r: subprocess.CompletedProcess[str], *named: str | Path) -> str:
    """The one ``build failed:`` line of a build that failed; asserts exit 1, no traceback, ``named`` in it."""
    lines = [x for x in r.stderr.splitlines() if x.startswith("build failed:")]
    assert r.returncode == 1, f"exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}"
    assert len(lines) == 1, r.stderr[-4000:]
    assert "Traceback" not in r.stderr, r.stderr[-4000:]
    for name in named:
        assert str(name) in lines[0], lines[0]
    return lines[0]


@contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``where`` with ``options`` (``size=300k``, ``nr_inodes=40``, ``ro``), unmounted after."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def remount(where: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(where)], check=True)


@pytest.mark.slow
def test_a_full_disk_names_the_output_and_the_kept_cache_which_the_next_build_reuses(
    tiny: Path, tmp_path: Path
) -> None:
    with tmpfs(tmp_path / "disk", "size=300k") as disk:
        out, cache = disk / "out", disk / ".out.cache"
        line = failed_line(weir_build(tiny, out), out, cache, f"`rm -rf {cache}`")
        assert "no space left on the file system of" in line and "holds some of that space" in line
        assert cache.is_dir() and not out.exists()
        remount(disk, "size=20m")  # room again
        again = weir_build(tiny, out)
        assert again.returncode == 0, again.stderr[-4000:]
        assert f"reusing the work a failed build kept in {cache}" in again.stdout
        assert (out / "shards" / "manifest.json").is_file() and not cache.exists()


@pytest.mark.slow
def test_no_free_inodes_is_said_as_such_and_the_next_build_with_inodes_succeeds(tiny: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "disk", "size=50m,nr_inodes=40") as disk:
        out = disk / "out"
        line = failed_line(weir_build(tiny, out), out, disk / ".out.cache")
        assert "no free inodes on the file system of" in line
        remount(disk, "nr_inodes=10000")
        again = weir_build(tiny, out)
        assert again.returncode == 0, again.stderr[-4000:]
        assert (out / "shards" / "manifest.json").is_file()


def test_a_read_only_mount_is_named_and_debug_adds_the_traceback(tiny: Path, tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "size=1m,ro") as ro:
        line = failed_line(weir_build(tiny, ro / "out"), ro / "out")
        assert "read-only file system" in line and "--out DIR" in line
        debug = weir_build(tiny, ro / "out", "--debug")
        assert "Traceback" in debug.stderr and debug.stderr.count("build failed:") == 1


def test_a_folder_without_write_permission_is_named(tiny: Path, tmp_path: Path) -> None:
    prefix: tuple[str, ...] = ()
    if os.geteuid() == 0:  # root writes anywhere unless it gives up CAP_DAC_OVERRIDE, which setpriv does
        if shutil.which("setpriv") is None:
            pytest.skip("root writes into a chmod 555 folder, and setpriv (to drop CAP_DAC_OVERRIDE) is missing")
        drop = "-dac_override,-dac_read_search"
        prefix = ("setpriv", "--bounding-set", drop, "--inh-caps", drop, "--")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    try:
        line = failed_line(weir_build(tiny, locked / "out", prefix=prefix), locked)
        assert "permission denied writing" in line and "--out DIR" in line
    finally:
        locked.chmod(0o755)


@contextmanager
def dead_head() -> Iterator[LocalRayCluster]:
    """A one-node Ray cluster on 127.0.0.1 (skips without ray): yielded running; kill its processes to kill it."""
    pytest.importorskip("ray", reason="ray is not installed (the Ray engine's tests need a real Ray cluster)")
    with LocalRayCluster(nodes=1) as cluster:
        yield cluster
        for proc in cluster.processes():
            proc.kill()


def test_a_killed_ray_head_ends_the_build_in_one_line_at_once(tiny: Path, tmp_path: Path) -> None:
    with dead_head() as cluster:
        address = cluster.address
        for proc in cluster.processes():
            proc.kill()
        started = time.monotonic()
        r = weir_build(tiny, tmp_path / "out", "--engine", "ray", "--ray-address", address)
        line = failed_line(r, f"the Ray head at {address} does not answer")
        assert "start the Ray cluster again" in line
        assert time.monotonic() - started < 120, "Ray's own retries take minutes; the check takes seconds"


@pytest.mark.slow
def test_a_ray_head_killed_during_the_build_ends_it_in_one_line(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "pipelines.cli", "build", str(tiny), "--out", str(out), "--engine", "ray"]
    with dead_head() as cluster:
        log, errs = tmp_path / "stdout", tmp_path / "stderr"
        with log.open("w") as o, errs.open("w") as e:
            driver = subprocess.Popen([*cmd, "--ray-address", cluster.address], stdout=o, stderr=e, cwd=ROOT)
            try:
                while "  tokenizer" not in log.read_text():  # the next stage connects to Ray
                    assert driver.poll() is None, errs.read_text()[-4000:]
                    time.sleep(0.1)
                for proc in cluster.processes():
                    proc.kill()
                driver.wait(timeout=TIMEOUT_S)
            finally:
                driver.kill()
        r = subprocess.CompletedProcess(cmd, driver.returncode, log.read_text(), errs.read_text())
        line = failed_line(r, f"the Ray head at {cluster.address} stopped answering", out.parent)
        assert " in stage " in line and "start the Ray cluster again" in line


@pytest.mark.slow
@pytest.mark.parametrize("limit_mb", [700, 1000, 1400, 2000])
def test_a_build_under_a_memory_limit_completes_or_ends_in_one_line(tiny: Path, tmp_path: Path, limit_mb: int) -> None:
    out = tmp_path / "out"
    r = weir_build(tiny, out, limit_mb=limit_mb)  # never hangs: a timeout fails the test
    if r.returncode == 0:
        assert (out / "shards" / "manifest.json").is_file() and "build failed" not in r.stderr
        return
    line = failed_line(r, out, f"under the address-space limit of {limit_mb} MB (ulimit -v)")
    assert line.startswith("build failed: out of memory ")
    assert "raise the limit" in line  # and the stage's own setting, where it has one


@pytest.mark.slow
def test_a_build_under_a_generous_memory_limit_succeeds_in_its_watched_child(tiny: Path, tmp_path: Path) -> None:
    r = weir_build(tiny, tmp_path / "out", limit_mb=16 << 10)
    assert r.returncode == 0, r.stderr[-4000:]
    assert (tmp_path / "out" / "shards" / "manifest.json").is_file()
