"""One writer per output: the output's lock, and the coordination with the Dagster UI's runs that write it.

A local build holds ``.<dest>.lock`` beside its output (:func:`output_lock`, an ``flock`` the kernel releases
even on ``kill -9``); a build into object storage locks its driver's local working folder instead
(:func:`lock_file`). A second build into the same output is refused naming the holder's pid
(:class:`~pipelines.lease.BuildBusy`), or waits for it.

With the Dagster UI beside: a build into the mix's own output (the folder the UI builds,
:func:`pipelines.build.ui_output`) waits for, or refuses, the UI's runs in progress that write it
(:func:`dagster_writers`, :func:`wait_for_writers`) before it starts, and waits for them again before it swaps
its staging folder in; the UI's automation starts nothing while the output's lock is held (:func:`lock_holder`,
read by :class:`pipelines.automation.OutputFree`), and a build's own materializations never prompt it to build
again (:data:`pipelines.build.BUILD_TAG`).
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import dagster as dg

from assets.storage import work_folder
from contract.store import is_local
from mixing import Mix
from pipelines.build import ELSEWHERE_TAG
from pipelines.lease import BuildBusy

__all__ = ["dagster_writers", "lock_file", "lock_holder", "output_lock", "wait_for_writers"]


@contextmanager
def output_lock(dest: Path, wait: bool, say: Callable[[str], None]) -> Iterator[None]:
    """Hold ``.<dest>.lock``; the holder removes it when done, so a failed build leaves nothing beside ``dest``.

    Removing a lock file is safe because a process that got the flock checks that the file it locked is
    still the one at the path (not one its holder has just removed) and otherwise starts over.
    """
    lock = lock_file(dest)
    lock.parent.mkdir(parents=True, exist_ok=True)
    waiting = False
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except PermissionError:  # another user's lock file: reading is enough to take the flock
            fd = os.open(lock, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            if not wait:
                os.close(fd)
                raise BuildBusy(
                    f"{dest}: another weir build (pid {holder}) is building into this folder; "
                    f"wait for it, or pass --wait to start when it is done (lock {lock})"
                ) from None
            if not waiting:
                say(f"waiting for the build of pid {holder} into {dest} to finish")
                waiting = True
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            st = os.stat(lock)
        except FileNotFoundError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) == (os.fstat(fd).st_dev, os.fstat(fd).st_ino):
            break
        os.close(fd)  # we locked a file its holder removed meanwhile: take the one at the path now
    try:
        with suppress(OSError):  # opened read-only: the lock holds, only the pid is not shown to others
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with suppress(OSError):  # removed while still held (see above); a folder we may not write: kept
            lock.unlink()
        os.close(fd)


def lock_file(dest: Path | str) -> Path:
    """The file :func:`output_lock` locks for ``dest``: ``.<dest>.lock`` beside a local folder; beside the local
    working folder (:func:`assets.storage.work_folder`) of an object-store root, which its build locks instead."""
    if is_local(str(dest)):
        path = Path(str(dest).removeprefix("file://")).expanduser().resolve()
    else:
        path = work_folder(str(dest).rstrip("/"))
    return path.with_name(f".{path.name}.lock")


def lock_holder(dest: Path | str) -> int | None:
    """The pid of the live process that holds ``dest``'s lock (:func:`output_lock`), else ``None``.

    Read, never taken: the UI's automation asks this every tick, and taking the lock even for an instant could
    make a ``weir build`` starting at that instant report the output busy. The holder writes its pid into the
    file and removes the file when done; a file left by a killed holder names a dead pid, which is not a
    holder. A file without a pid, younger than a minute (a holder between taking the lock and writing its pid),
    counts as held (-1). Only processes of this machine are seen.
    """
    try:
        text = lock_file(dest).read_text().strip()
    except OSError:  # no lock file: nobody holds it
        return None
    if not text.isdigit():  # taken this instant, its pid not written yet; or left so by a holder killed then
        with suppress(OSError):
            return -1 if time.time() - lock_file(dest).stat().st_mtime < 60 else None
        return None
    pid = int(text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's live process
        pass
    return pid


_WRITING = (
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
)


def dagster_writers(instance: dg.DagsterInstance, mix: Mix) -> list[dg.DagsterRun]:
    """The runs in ``instance`` that are writing (or queued to write) the mix's own output: runs of its job
    ``build_<mix>`` or of any of its assets (automation's, *Materialize all*'s), not finished, less runs of
    ``weir build`` into other outputs (:data:`pipelines.build.ELSEWHERE_TAG`). What a stopped UI left is left out:
    a started run whose processes all died (every process that logged an event of it is looked for on this
    machine), and a queued run while no Dagster daemon beats (no daemon, no start: when one starts again, the
    output's lock keeps automation still, and a build looks again before it swaps its folder in)."""
    found = []
    daemon = _daemon_alive(instance)
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=list(_WRITING))):
        if run.tags.get(ELSEWHERE_TAG) == "true":
            continue
        assets = run.asset_selection or set()
        if run.job_name != f"build_{mix.name}" and not any(k.path[0] == mix.name for k in assets):
            continue
        queued = run.status in (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED)
        if (queued and daemon) or (not queued and _alive(instance, run)):
            found.append(run)
    return found


def _daemon_alive(instance: dg.DagsterInstance, within_s: float = 120.0) -> bool:
    """Whether a Dagster daemon of ``instance`` beat in the last ``within_s`` seconds (it beats every 30 s)."""
    now = time.time()
    return any(now - beat.timestamp < within_s for beat in instance.get_daemon_heartbeats().values())


def _alive(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """Whether a process that logged an event of ``run`` still lives (True when none is known yet)."""
    pids = {e.dagster_event.pid for e in instance.all_logs(run.run_id) if e.dagster_event is not None}
    pids.discard(None)
    if not pids:
        return True
    for pid in pids:
        try:
            os.kill(int(pid), 0)  # type: ignore[arg-type]
        except ProcessLookupError:
            continue
        except PermissionError:
            return True
        return True
    return False


def wait_for_writers(
    instance: dg.DagsterInstance | None,
    mix: Mix,
    tags: dict[str, str],
    dest: Path | str,
    wait: bool,
    say: Callable[[str], None],
    poll_s: float = 1.0,
) -> None:
    """Return once no run of ``instance`` writes ``dest`` (:func:`dagster_writers`); only for a build into the
    mix's own output (``tags`` without :data:`pipelines.build.ELSEWHERE_TAG`), as nothing else writes another.
    Without ``wait``, raise :class:`BuildBusy` naming the run instead of waiting."""
    if instance is None or ELSEWHERE_TAG in tags:
        return
    told = False
    while writers := dagster_writers(instance, mix):
        run = writers[0]
        what = f"Dagster run {run.run_id} ({run.job_name}, {run.status.value.lower()})"
        if not wait:
            raise BuildBusy(
                f"{dest}: {what} is writing this folder; wait for it, or pass --wait to start when it is done"
            )
        if not told:
            say(f"waiting for {what} writing {dest} to finish")
            told = True
        time.sleep(poll_s)
