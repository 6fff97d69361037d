"""pipelines/memory_guard.py: the watched child of ``weir build`` under an address-space limit.

:func:`supervise` runs real child processes here (small Python programs standing in for the build: one that
aborts, one that stalls, one that waits for another build, one that prints a Rust panic's report) and is checked
for its one line, its exit status and the stderr it passes through. The real build under real limits is in
tests/faults/test_build_failures.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pipelines import memory_guard
from pipelines.failures import address_limit
from pipelines.memory_guard import STARTING, STATUS_ENV, WAITING, child_env, is_native_noise, supervise
from tests.conftest import ROOT

GB = 1 << 30
# what a child stands in for: records its stage as the build's does, then does what the test says
CHILD = "import os, pathlib, sys, time; pathlib.Path(os.environ['{env}']).write_text({stage!r}); {then}"
RUST_PANIC = """
thread '<unnamed>' (7116) panicked at /root/.cargo/registry/src/tokio-1.53.1/src/runtime/worker.rs:514:13:
OS can't spawn worker thread: Resource temporarily unavailable (os error 11)
stack backtrace:
   0: std::panicking::begin_panic
             at /rustc/library/std/src/panicking.rs:1
note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose backtrace.
memory allocation of 1520 bytes failed
<jemalloc>: background thread creation failed (11)
build failed: out of memory in stage documents [qa] (PanicException)
"""


def run(then: str, stage: str = "documents [qa]", **kw: object) -> tuple[int, list[str]]:
    """:func:`supervise` of a child that records ``stage`` then runs ``then``; its status and the lines said."""
    said: list[str] = []
    code = supervise(
        ["build"],
        2 * GB,
        Path("/data/out"),
        command=[sys.executable, "-c", CHILD.format(env=STATUS_ENV, stage=stage, then=then)],
        say=said.append,
        **({"engine": "local"} | kw),  # type: ignore[arg-type]
    )
    return code, said


def test_the_childs_environment_bounds_its_reservations_unless_set() -> None:
    env = child_env(4 * GB, {"PATH": "/bin"})
    assert env["MALLOC_ARENA_MAX"] == "2" and env["ARROW_DEFAULT_MEMORY_POOL"] == "system"
    assert env["WEIR_DUCKDB_MEMORY_LIMIT"] == "1024MB" and str(ROOT) in env["PYTHONPATH"]
    assert child_env(64 * GB, {})["WEIR_DUCKDB_MEMORY_LIMIT"] == "2000MB"
    mine = child_env(4 * GB, {"MALLOC_ARENA_MAX": "8", "WEIR_DUCKDB_MEMORY_LIMIT": "3GB"})
    assert mine["MALLOC_ARENA_MAX"] == "8" and mine["WEIR_DUCKDB_MEMORY_LIMIT"] == "3GB"


def test_the_guard_is_needed_under_a_limit_only_and_never_in_the_child() -> None:
    probe = (
        "import resource, sys; from pipelines.memory_guard import needs_guard; a = needs_guard({}); "
        "resource.setrlimit(resource.RLIMIT_AS, (8 << 30, resource.getrlimit(resource.RLIMIT_AS)[1])); "
        f"print(a, needs_guard({{}}), needs_guard({{'{STATUS_ENV}': 'x'}}))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    assert out.split() == [str(address_limit() is not None), "True", "False"]  # (ours is the child's before)


def test_an_exit_status_passes_through_without_a_line() -> None:
    assert run("sys.exit(3)") == (3, [])


def test_an_aborted_child_ends_in_one_line_naming_stage_output_and_setting() -> None:
    code, said = run("os.abort()")
    assert code == 1 and len(said) == 1
    line = said[0]
    assert line.startswith("build failed: out of memory in stage documents [qa] building /data/out")
    assert "aborted (SIGABRT)" in line and "RAYON_NUM_THREADS" in line


def test_a_stalled_child_is_stopped_and_said(tmp_path: Path) -> None:
    stage = tmp_path / ".out.building-1"
    stage.mkdir()
    (stage / "f").write_bytes(b"x" * 5000)
    code, said = run("time.sleep(120)", stage="plan", stall_s=1.5, staging=lambda _pid: stage)
    assert code == 1 and len(said) == 1
    assert "in stage plan" in said[0] and "no CPU for" in said[0] and "WEIR_STALL_S" in said[0]
    assert f"its work in {stage}" in said[0]


def test_a_child_stalled_while_it_starts_its_pools_is_stopped_and_said() -> None:
    # under 700 MB, with fewer libraries loaded before, Arrow's reader in warm_pools waited forever for a thread
    code, said = run("time.sleep(120)", stage=STARTING, stall_s=1.5)
    assert code == 1 and len(said) == 1, said
    assert said[0].startswith("build failed: out of memory while starting building /data/out"), said[0]
    assert "no CPU for" in said[0] and "0.9 GB of address space before any stage" in said[0]
    # before and after it the start is not watched: the lease's and the instance lock's waits use no CPU
    assert run("time.sleep(3)", stage="", stall_s=1) == (0, [])


def test_warm_pools_is_watched_while_it_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    status = tmp_path / "status"
    monkeypatch.setenv(STATUS_ENV, str(status))
    seen: list[str] = []
    monkeypatch.setattr(memory_guard, "_warm", lambda: seen.append(status.read_text()))
    memory_guard.warm_pools()
    assert seen == [STARTING] and status.read_text() == ""


def test_a_child_waiting_for_another_build_or_on_a_cluster_is_not_a_stall() -> None:
    assert run("time.sleep(3)", stage=WAITING, stall_s=1) == (0, [])
    assert run("time.sleep(3)", stall_s=1, engine="ray") == (0, [])


def test_a_native_crash_report_is_held_back_unless_debug(capfd: pytest.CaptureFixture[str]) -> None:
    emit = f"sys.stderr.write({RUST_PANIC!r}); sys.exit(1)"
    assert run(emit) == (1, [])
    weirs = "build failed: out of memory in stage documents [qa] (PanicException)"
    assert capfd.readouterr().err.splitlines() == [weirs]
    assert run(emit, debug=True) == (1, [])
    assert capfd.readouterr().err == RUST_PANIC


def test_native_noise_line_by_line() -> None:
    state, kept = False, []
    for line in RUST_PANIC.splitlines(keepends=True):
        noise, state = is_native_noise(line, state)
        kept += [] if noise else [line]
    assert kept == ["\n", "build failed: out of memory in stage documents [qa] (PanicException)\n"]
    assert is_native_noise("note: a note of weir's\n", False) == (False, False)
    assert is_native_noise("warning: a warning\n", True) == (False, False)
