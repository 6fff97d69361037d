"""pipelines/failures.py: a build's error, unwrapped from Dagster, becomes one line naming kind, path and stage.

The errors are real where they can be made here: raised inside a Dagster op run in-process (the wrapper a build
sees), DuckDB out of memory under a tiny ``memory_limit``, OSErrors on a real folder. The file-system kinds on
real full, inode-less and read-only file systems are in tests/faults/test_build_failures.py.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import dagster as dg
import duckdb
import polars as pl
import pyarrow as pa
import pytest

from mixing.stages import STAGES
from pipelines.failures import MEMORY_SETTINGS, Failure, explain, human, memory_line, original, stage_of
from pipelines.ray_head import RayHeadLost


def _raised_in_op(error: BaseException, name: str = "documents__qa") -> BaseException:
    """What ``execute_in_process`` raises when the op ``name`` raises ``error`` (as a build's run does)."""

    @dg.op(name=name)
    def fail() -> None:
        raise error

    @dg.job
    def job() -> None:
        fail()

    with pytest.raises(BaseException) as info:
        job.execute_in_process(instance=dg.DagsterInstance.ephemeral())
    return info.value


def test_an_ops_error_is_unwrapped_and_names_its_stage_and_source(tmp_path: Path) -> None:
    raised = _raised_in_op(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "x")))
    assert isinstance(original(raised), OSError)
    assert stage_of(raised) == "documents [qa]"
    f = explain(raised, tmp_path / "out")
    assert f.kind == "disk_full" and f.stage == "documents [qa]"
    assert f"no space left on the file system of {tmp_path / 'out'}" in f.line
    assert "in stage documents [qa]" in f.line and "--out DIR" in f.line
    assert "\n" not in f.line


def test_a_wrapped_user_exception_is_followed_down() -> None:
    inner = MemoryError()

    class Wrapper(Exception):
        user_exception = inner

    assert original(Wrapper()) is inner


def test_a_stage_is_found_from_frames_or_from_what_the_build_said(tmp_path: Path) -> None:
    from pipelines import transaction

    with pytest.raises(OSError) as info:
        transaction._swap(tmp_path / "missing-stage", tmp_path / "out")  # a real transaction step failing
    assert stage_of(info.value) == "replacing the output"
    assert stage_of(ValueError("x"), said="plan") == "plan"
    assert stage_of(ValueError("x")) is None


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("parquet: File out of specification: underlying IO error: No space left on device (os error 28)", "disk_full"),
        ('IO Error: Could not write file "/x/weir.duckdb": No space left on device', "disk_full"),
        ("Disk quota exceeded (os error 122)", "quota"),
        ("Cannot allocate memory (os error 12)", "memory"),
        ("memory allocation of 1520 bytes failed", "memory"),
        ("could not spawn threads: ThreadPoolBuildError { kind: IOError(Os { code: 11, kind: WouldBlock } }", "memory"),
        ("Failed to connect to GCS at address 127.0.0.1:6379 within 5 seconds", "ray_head"),
        ("a plain bug", "error"),
    ],
)
def test_errors_of_foreign_types_are_told_by_their_words(tmp_path: Path, text: str, kind: str) -> None:
    assert explain(pl.exceptions.ComputeError(text), tmp_path / "out").kind == kind


def test_duckdb_out_of_memory_names_the_stage_and_its_setting(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "w.duckdb"), config={"memory_limit": "2MB", "threads": 1})
    with pytest.raises(duckdb.OutOfMemoryException) as info:
        con.execute("SELECT list(range(i, i + 100)) AS l FROM range(200000) t(i) ORDER BY l DESC").fetchall()
    f = explain(_raised_in_op(info.value, "length_stats"), tmp_path / "out")
    assert f.kind == "memory" and f.stage == "length_stats"
    assert f.line.startswith("DuckDB reached its memory limit (1.9 MiB) in stage length_stats")
    assert "raise WEIR_DUCKDB_MEMORY_LIMIT" in f.line and str(tmp_path / "out") in f.line
    # the process out of address space (DuckDB's allocation refused, its own limit not reached): the limit
    process = explain(duckdb.OutOfMemoryException("Failed to allocate block of 256 bytes (bad allocation)"), "o")
    assert process.kind == "memory" and "raise the limit" in process.line


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        pa.ArrowMemoryError("malloc of size 65536 failed"),
        pl.exceptions.PanicException("The global thread pool has not been initialized.: ThreadPoolBuildError"),
        RuntimeError("can't start new thread"),
    ],
)
def test_every_out_of_memory_form_is_memory(tmp_path: Path, error: BaseException) -> None:
    f = explain(error, tmp_path / "out", said="tokenizer")
    assert f.kind == "memory" and "tokenizer.sample_bytes" in f.line


def test_a_library_that_could_not_be_mapped_is_memory_while_starting(tmp_path: Path) -> None:
    try:
        try:
            raise OSError("libllvmlite.so: failed to map segment from shared object")
        except OSError:
            raise OSError("Could not find/load shared object file 'libllvmlite.so'") from None
    except OSError as e:  # `from None` hides the context from tracebacks; it is still there
        f = explain(e, tmp_path / "out")
    assert f.kind == "memory" and "while starting" in f.line and "0.9 GB" in f.line


def test_memory_settings_cover_every_stage() -> None:
    assert set(MEMORY_SETTINGS) == {s.name for s in STAGES} | {"starting"}
    assert "in stage plan" in memory_line("plan", "MemoryError") and "WEIR_DUCKDB_MEMORY_LIMIT" in memory_line(
        "plan", "MemoryError"
    )


def test_a_kept_cache_on_the_full_file_system_is_named_with_its_size_and_how_to_remove_it(tmp_path: Path) -> None:
    cache = tmp_path / ".out.cache"
    (cache / "sources").mkdir(parents=True)
    (cache / "sources" / "chunk").write_bytes(b"x" * 100_000)
    f = explain(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "out", said="plan", cache=cache)
    assert f"kept in {cache} (" in f.line and f"`rm -rf {cache}`" in f.line and "holds some of that space" in f.line
    g = explain(MemoryError(), tmp_path / "out", said="plan", cache=cache)
    assert f"kept in {cache}" in g.line and "rm -rf" not in g.line  # memory: it holds no space that ran out


def test_read_only_forbidden_and_busy_folders(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ro = explain(OSError(errno.EROFS, "Read-only file system", str(tmp_path / ".out.lock")), out)
    assert ro.kind == "read_only" and str(out) in ro.line and "writable folder" in ro.line
    denied = explain(PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "x")), out, said="plan")
    assert denied.kind == "permission" and str(tmp_path / "x") in denied.line and "in stage plan" in denied.line
    busy = explain(OSError(errno.EBUSY, "Device or resource busy", str(out)), out)
    assert busy.kind == "busy" and f"--out {out / 'out'}" in busy.line


def test_a_lost_ray_head_and_a_plain_error(tmp_path: Path) -> None:
    lost = explain(RayHeadLost("the Ray head at 127.0.0.1:1 does not answer (connection refused)"), tmp_path)
    assert lost.kind == "ray_head" and "127.0.0.1:1" in lost.line and "start the Ray cluster again" in lost.line
    plain = explain(ValueError("bad value"), tmp_path)
    assert plain == Failure("error", None, "ValueError: bad value", plain.error)


def test_no_free_inodes_is_told_from_the_file_systems_figures(tmp_path: Path) -> None:
    st = os.statvfs(tmp_path)
    f = explain(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "f")), tmp_path / "out")
    assert f.kind == ("no_inodes" if st.f_files and st.f_favail == 0 else "disk_full")


def test_human() -> None:
    assert [human(n) for n in (0, 999, 1000, 12_345_678)] == ["0 B", "999 B", "1.0 KB", "12.3 MB"]
