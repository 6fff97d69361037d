"""``weir build`` under an address-space limit (``ulimit -v``): the build completes within it, or ends in one
line naming the stage and the setting to change; it never hangs.

Under RLIMIT_AS what a process reserves counts, not what it uses: glibc gives every thread that allocates a
malloc arena of 64 MB, Arrow's mimalloc pool reserves 1 GiB at its first allocation, so the demo build reserved
3.1 GB to use 0.55 GB. And native code fails in ways Python cannot catch when an allocation fails: Rust (polars,
tokenizers) aborts the process, and polars' parquet reader can wait forever for a task that could not allocate.
So under a limit ``weir build`` runs the build in a child process (:func:`supervise`) and only watches it:

- the child's environment bounds those reservations unless the caller set them (:func:`child_env`):
  ``MALLOC_ARENA_MAX=2``, ``ARROW_DEFAULT_MEMORY_POOL=system`` and ``WEIR_DUCKDB_MEMORY_LIMIT`` a quarter of the
  limit (at most DuckDB's default of the build, 2GB): the demo build then reserves 1.2 GB at most;
- the child loads the libraries its stages load on first use and starts polars' and Arrow's thread pools before
  the first stage (:func:`warm_pools`), while there is room, so that no later call has a thread to start;
- the child writes the stage it is in to the file ``$WEIR_BUILD_STATUS`` (:func:`note_stage`); when it dies on a
  signal (an abort on a failed native allocation, the kernel's OOM killer) the watcher prints the line naming
  that stage and its setting (:func:`pipelines.failures.memory_line`);
- when the child uses no CPU for ``stall_s`` seconds in a stage or while it starts its pools (``WEIR_STALL_S``,
  default 300; never while it waits for another build), the watcher kills it and says so in one line.

The child reports its own failures (:mod:`pipelines.failures`). Its stderr passes through the watcher less a
native crash's report (a Rust panic, ``memory allocation of N bytes failed``), which ``--debug`` shows.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import IO

from pipelines import PROJECT_ROOT
from pipelines.failures import address_limit, human, memory_line

__all__ = [
    "STALL_ENV",
    "STARTING",
    "STATUS_ENV",
    "WAITING",
    "child_env",
    "is_native_noise",
    "needs_guard",
    "note_stage",
    "supervise",
    "warm_pools",
]

STATUS_ENV = "WEIR_BUILD_STATUS"  # set in the child: the file it writes its stage to
STALL_ENV = "WEIR_STALL_S"
WAITING = "waiting"  # the status while the build waits for another build (no CPU is expected)
# the status while the child loads its libraries and starts its pools (watched: the start is unwatched otherwise,
# for the waits before the first stage, the lease's and the instance's lock, where no CPU is expected either)
STARTING = "starting"
_NATIVE_START = re.compile(r"panicked at|^Fatal Python error|^terminate called")
_NATIVE_LINE = re.compile(
    r"memory allocation of|<jemalloc>:|^skipping backtrace|^\s+\d+: |^\s+at |^\s+what\(\):|"
    r"^(Current thread|Thread) 0x|^  File \".*\", line \d+ in "  # faulthandler's dump (PYTHONFAULTHANDLER)
)


def needs_guard(env: dict[str, str] | None = None) -> bool:
    """Whether ``weir build`` should run its build in a watched child: an address-space limit is set and this
    process is not that child already."""
    env = dict(os.environ) if env is None else env
    return address_limit() is not None and STATUS_ENV not in env


def child_env(limit: int, env: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment under a limit of ``limit`` bytes: ``env`` (default ours) with what bounds the
    reservations added where not set (module docstring)."""
    out = dict(os.environ if env is None else env)
    out.setdefault("MALLOC_ARENA_MAX", "2")
    out.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    out.setdefault("WEIR_DUCKDB_MEMORY_LIMIT", f"{max(64, min(2000, (limit >> 20) // 4))}MB")
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), out.get("PYTHONPATH", "")) if p)
    return out


def note_stage(stage: str) -> None:
    """In the child, record the stage it is in (``documents [qa]``, :data:`WAITING`) for the watcher."""
    path = os.environ.get(STATUS_ENV)
    if path:
        with suppress(OSError):  # a full disk: the stage is then unknown to the watcher, nothing worse
            Path(path).write_text(stage)


def warm_pools() -> None:
    """Load the libraries the build's stages load on first use (numba for packing, matplotlib for the plots),
    then start the thread pools polars and Arrow start on first use (writer, reader, its I/O runtime), now; the
    status meanwhile :data:`STARTING`, so that a stall in it is stopped and said (a reader waiting forever for a
    thread it could not start)."""
    note_stage(STARTING)
    _warm()
    note_stage("")


def _warm() -> None:
    import io

    # first, as when they loaded with the assets: a limit too small for them then fails here, where the failure is
    # one line; with them loaded later, Arrow's reader below waited forever for a thread it could not start
    import matplotlib.figure  # noqa: F401
    import numba  # noqa: F401
    import polars as pl
    import pyarrow.parquet as pq

    frame = pl.DataFrame({"x": list(range(64))})
    buf = io.BytesIO()
    frame.write_parquet(buf)
    frame.sort("x")
    try:  # a file read starts one more thread; where no file can be written (a full disk), the rest must do
        with tempfile.NamedTemporaryFile(suffix=".parquet") as f:
            f.write(buf.getvalue())
            f.flush()
            pl.read_parquet(f.name)
            pq.read_table(f.name)
    except OSError as e:
        if "memory" in str(e).lower():
            raise


def is_native_noise(line: str, in_report: bool) -> tuple[bool, bool]:
    """Whether ``line`` of the child's stderr belongs to a native crash's report, and whether that report goes on
    after it: a Rust panic's message and backtrace up to its ``note:``, a fatal error's lines up to a blank one,
    and single lines (``memory allocation of N bytes failed``, jemalloc's). weir's own lines never are."""
    if line.startswith(("build failed", "warning", "note: ") if not in_report else ("build failed", "warning")):
        return False, False
    if _NATIVE_START.search(line):
        return True, True
    if in_report:
        return True, not (line.startswith("note: ") or not line.strip())
    return bool(_NATIVE_LINE.search(line)), False


def supervise(
    argv: list[str],
    limit: int,
    dest: Path | str,
    *,
    engine: str,
    staging: Callable[[int], Path | None] = lambda _pid: None,
    debug: bool = False,
    stall_s: float | None = None,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    command: list[str] | None = None,
) -> int:
    """Run ``python -m pipelines.cli <argv>`` as the build's child under :func:`child_env` and return its exit
    status; when it dies on a signal or stalls (module docstring), ``say`` the one ``build failed:`` line and
    return 1. ``staging(pid)``: the folder the child builds in (named in that line when it exists). The stall
    watch applies to the ``local`` engine only (a cluster's driver waits without using CPU). ``command``: what
    runs ``argv`` (default ``python -m pipelines.cli``)."""
    stall = float(os.environ.get(STALL_ENV, "300")) if stall_s is None else stall_s
    with tempfile.NamedTemporaryFile("w+", prefix="weir-build-status-", delete=False) as status:
        status_path = Path(status.name)
    env = child_env(limit) | {STATUS_ENV: str(status_path)}
    main = threading.current_thread() is threading.main_thread()  # signal handlers are the main thread's to set
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None  # Ctrl-C reaches the child itself
    try:
        child = subprocess.Popen(
            [*(command or [sys.executable, "-m", "pipelines.cli"]), *argv],
            env=env,
            stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent,
        )
        old_term = signal.signal(signal.SIGTERM, lambda *_: child.terminate()) if main else None
        assert child.stderr is not None
        relay = threading.Thread(target=_relay, args=(child.stderr, debug), daemon=True)
        relay.start()
        stalled = _wait(child, status_path, stall if engine == "local" else None)
        relay.join(timeout=10)
        if main:
            signal.signal(signal.SIGTERM, old_term)
        stage = _read(status_path) or None
    finally:
        if main:
            signal.signal(signal.SIGINT, old_int)
        status_path.unlink(missing_ok=True)
    if stalled is None and child.returncode >= 0:
        return child.returncode
    if stage == WAITING:
        stage = None
    if stalled is not None:
        what = (
            f"the build used no CPU for {stalled:.0f} s, a library waiting on a thread or an allocation that failed; "
            f"it was stopped ({STALL_ENV} sets how long)"
        )
    else:
        name = signal.Signals(-child.returncode).name
        what = (
            f"the build process was killed ({name}): the kernel's out-of-memory killer, or kill -9"
            if name == "SIGKILL"
            else f"the build process was aborted ({name}): native code could not allocate"
        )
    left = staging(child.pid)
    tail = ""
    if left is not None and left.is_dir():
        tail = f"; its work in {left} ({human(_size(left))}) is removed by the next build"
    say(f"build failed: {memory_line(stage, what, dest)}{tail}")
    return 1


def _wait(child: subprocess.Popen[bytes], status: Path, stall_s: float | None) -> float | None:
    """Wait for ``child`` to end; with ``stall_s``, kill it once it used no CPU for that long in a stage and
    return how long it stalled (None when it ended by itself)."""
    last_cpu, since = _cpu(child.pid), time.monotonic()
    while True:
        try:
            child.wait(timeout=1.0)
            return None
        except subprocess.TimeoutExpired:
            pass
        cpu = _cpu(child.pid)
        if cpu != last_cpu or _read(status) in ("", WAITING):
            last_cpu, since = cpu, time.monotonic()
        elif stall_s is not None and time.monotonic() - since >= stall_s:
            child.kill()
            child.wait()
            return time.monotonic() - since


def _cpu(pid: int) -> int:
    """Clock ticks of CPU ``pid`` used (all its threads), 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime


def _relay(stream: IO[bytes], debug: bool) -> None:
    """Copy the child's stderr to ours line by line, less a native crash's report unless ``debug``."""
    in_report, blank = False, ""
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace")
        if not line.strip() and not in_report and not debug:  # a blank line opens a Rust panic's report
            blank += line
            continue
        noise, in_report = is_native_noise(line, in_report)
        if debug or not noise:
            sys.stderr.write(blank + line)
            sys.stderr.flush()
        blank = ""


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _size(folder: Path) -> int:
    n = 0
    for d, _dirs, files in os.walk(folder):
        for f in files:
            try:
                n += os.lstat(os.path.join(d, f)).st_blocks * 512
            except OSError:
                continue
    return n


def _die_with_parent() -> None:
    """In the child before exec: end with the watcher (PR_SET_PDEATHSIG), as the build did in one process."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the child may outlive a killed watcher
        pass
