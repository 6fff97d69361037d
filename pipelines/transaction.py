"""The transaction behind ``weir build``: one build at a time per output, and never a partial output.

:func:`build_output` takes the output's lock (:func:`output_lock`), removes what killed builds left beside
it, builds (:func:`pipelines.build.build_mix`) into a staging folder beside the output, and swaps it in only
when the build succeeded. :func:`reuse_previous` seeds a fresh staging folder with the previous output's
tokenized chunks and trained tokenizer (hard links; those files are only ever replaced, never written in
place), so that an incremental rebuild re-tokenizes only chunks whose files changed, while the staging
folder still replaces the output only when the whole build succeeded.

A build into object storage (``dest`` an fsspec URL, :func:`build_remote`) has no folder to swap: each stage
publishes under its keys and commits last (:mod:`mixing.output.commit`), the shards' manifest is removed
before the first shard is written and written after the last, and the driver's local working folder
(:func:`assets.storage.work_folder`) is locked instead of the output.

A build that fails (an infeasible plan after minutes of tokenizing) keeps its work: its staging folder, less
its shards, becomes the hidden sibling ``.<dest>.cache`` (see :func:`work_cache`, :func:`kept_work`), never
``dest`` itself, so no reader sees a partial build. The next build seeds from it as from the previous output
(reused chunks are verified against their checksums, :mod:`mixing.ingest.chunks`), ``weir plan`` plans
from its documents in seconds, and a successful build removes it.

One writer per output, with the Dagster UI beside: a build into the mix's own output (the folder the UI builds,
:func:`pipelines.build.ui_output`) waits for, or refuses, the UI's runs in progress that write it
(:func:`dagster_writers`) before it starts, and waits for them again before it swaps its staging folder in; the
UI's automation starts nothing while the output's lock is held (:func:`lock_holder`, read by
:class:`pipelines.automation.OutputFree`), and a build's own materializations never prompt it to build again
(:data:`pipelines.build.BUILD_TAG`).
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from assets import WeirEngine
from assets.storage import work_folder
from contract.atomic import file_mode
from contract.errors import WeirError
from contract.store import Store, is_local, redact_url
from mixing import Mix
from mixing.output.commit import COMMITS
from pipelines.build import ELSEWHERE_TAG, build_mix, build_tags
from pipelines.lease import BuildBusy, Lease, LeaseLost, root_lease
from pipelines.outage import Outages, riding_outages, unreachable
from pipelines.resources import storage_resource

__all__ = [
    "BuildBusy",
    "BuildOutcome",
    "build_output",
    "build_remote",
    "dagster_writers",
    "kept_work",
    "lock_file",
    "lock_holder",
    "output_lock",
    "reuse_previous",
    "work_cache",
]


@dataclass(frozen=True)
class BuildOutcome:
    """What :func:`build_output` did besides building: files reused, leftovers of killed builds removed."""

    dest: Path | str
    reused_files: int
    leftovers: int
    leftover_bytes: int


def build_output(
    mix: Mix,
    dest: Path | str,
    *,
    fresh: bool = False,
    wait: bool = False,
    say: Callable[[str], None] = print,
    instance: dg.DagsterInstance | None = None,
    engine: WeirEngine | None = None,
) -> BuildOutcome:
    """Build ``mix`` into the folder ``dest`` as one transaction; a failure or a kill never leaves a partial output.

    Holds ``.<dest>.lock`` (an ``flock``, released by the kernel even on ``kill -9``) for the whole build
    and removes it at the end;
    a second build into the same ``dest`` raises :class:`BuildBusy` naming the holder's pid, or with ``wait``
    blocks until the lock is free. Under the lock, the staging folders that killed builds left beside
    ``dest`` (``.<dest>.building-<pid>``, ``.<dest>.old-<pid>``) are removed; if a build was killed between
    the two renames of its swap, the previous output is put back first. The build runs in
    ``.<dest>.building-<pid>`` (seeded by :func:`reuse_previous` unless ``fresh``) and replaces ``dest`` only
    when it succeeded. Raises what :func:`build_mix` raises; then the staging folder, less its shards, is
    kept as :func:`work_cache` (when it holds tokenized chunks) for the next build and ``weir plan``.
    Materializations go to ``instance`` (default: a throwaway one); ``engine`` runs the fan-out work (default
    local). An fsspec URL ``dest`` is built by :func:`build_remote`.
    """
    if not is_local(str(dest)):
        return build_remote(mix, str(dest), fresh=fresh, wait=wait, say=say, instance=instance, engine=engine)
    dest = Path(str(dest).removeprefix("file://")).resolve()
    if mix.continues is not None and is_local(mix.continues.base) and Path(mix.continues.base).resolve() == dest:
        raise WeirError(f"{dest}: a continuation cannot replace its base; build it into another folder (--out)")
    cache = work_cache(dest)
    tags = build_tags(mix, dest)
    with output_lock(dest, wait, say):
        _wait_for_writers(instance, mix, tags, dest, wait, say)
        n, size = _remove_leftovers(dest, say)
        if n:
            say(f"removed {n} leftover{'s' if n > 1 else ''} of killed builds ({_human(size)})")
        stage = dest.with_name(f".{dest.name}.building-{os.getpid()}")
        try:
            reused = 0
            if not fresh:  # the newest work first: a failed build's tokenizer wins over the output's
                reused += reuse_previous(cache, stage) if cache.is_dir() else 0
                reused += reuse_previous(dest, stage) if dest.is_dir() else 0
                base = Path(mix.continues.base) if mix.continues is not None and is_local(mix.continues.base) else None
                reused += reuse_previous(base, stage) if base is not None and base.is_dir() else 0
            if cache.is_dir() and not fresh:
                say(f"reusing the work a failed build kept in {cache} ({reused} files with the output's)")
            build_mix(mix, stage, say=say, instance=instance, engine=engine, tags=tags)
            # a run the UI launched just before this build took the lock may be writing dest: let it finish
            _wait_for_writers(instance, mix, tags, dest, True, say)
            _swap(stage, dest)
        except BaseException:
            _keep_work(stage, cache)
            raise
        shutil.rmtree(cache, ignore_errors=True)  # its chunks live on in dest (or were stale)
    return BuildOutcome(dest, reused, n, size)


def build_remote(
    mix: Mix,
    url: str,
    *,
    fresh: bool = False,
    wait: bool = False,
    say: Callable[[str], None] = print,
    instance: dg.DagsterInstance | None = None,
    engine: WeirEngine | None = None,
) -> BuildOutcome:
    """Build ``mix`` into the object-store root ``url`` (S3 settings from the environment, as the ``storage``
    resource binds them); a failure or a kill leaves no stage committed that is incomplete.

    Refuses a root fsspec cannot reach (:class:`~contract.store.StoreError`, before anything is written).
    One build at a time per root: the lock on the driver's local working folder, and the root's lease
    (:mod:`pipelines.lease`) against drivers on other machines (:class:`BuildBusy` names the holder). Chunks already in
    the root are reused by key; what a killed build left is never trusted (no commit record, no chunk report,
    no manifest lists it) and is overwritten or removed by this one. ``fresh`` removes the root's chunks and
    commit records and the working folder first. After success, sources no longer in the mix are removed.

    Every write into the root is fenced by the lease: a build that lost it publishes nothing more and fails
    with :class:`~pipelines.lease.LeaseLost`. An endpoint outage is ridden out for up to ``WEIR_OUTAGE_S``
    seconds (:mod:`pipelines.outage`, said once); a longer one is one
    :class:`~pipelines.outage.EndpointUnreachable` line that says whether the lease was released or is left to
    expire.
    """
    resource = storage_resource(url, per_mix=False, bound=False)
    store = Store.open(url, resource.storage_options())
    work = work_folder(store.url)
    tags = build_tags(mix, store.url)
    where = redact_url(store.url)
    held: list[Lease | None] = []
    outages: Outages | None = None
    try:
        with output_lock(work, wait, say):
            # before the lease, not while holding it: the UI's runs into this root take the lease too
            _wait_for_writers(instance, mix, tags, store.url, wait, say)
            with (
                root_lease(store, wait, say) as lease,
                riding_outages(where, say, until=lease.deadline if lease is not None else None) as outages,
            ):
                held.append(lease)
                if fresh:
                    shutil.rmtree(work, ignore_errors=True)
                    for folder in ("sources", COMMITS):
                        store.remove_tree(folder)
                build_mix(mix, store.url, say=say, instance=instance, engine=engine, tags=tags)
                for old in set(store.names("sources")) - set(mix.sources):
                    store.remove_tree(f"sources/{old}")
                    store.remove(f"{COMMITS}/documents/{old}.json")
                    store.remove(f"{COMMITS}/source_index/{old}.json")
    except Exception as e:
        cause: BaseException = e
        while getattr(cause, "user_exception", None) is not None:  # a stage's error, as Dagster wraps it
            cause = cause.user_exception  # type: ignore[attr-defined]
        if isinstance(cause, LeaseLost):
            raise cause from None  # one line, however deep in a stage it was raised
        outage = not isinstance(cause, WeirError) and unreachable(cause)
        if outages is None or not (outages.exceeded is not None or outage):
            raise
        lease = held[0] if held else None
        if lease is None:
            left = ""
        elif lease.released:
            left = "its lease was released"
        elif lease.lost:
            left = f"its lease lapsed meanwhile ({lease.lost}), and another build may hold it now"
        else:
            left = f"its lease is left to expire {lease.ttl:g} s after its last renewal (WEIR_LEASE_TTL)"
        raise outages.failure(cause, left) from None
    return BuildOutcome(store.url, 0, 0, 0)


def work_cache(dest: Path) -> Path:
    """``.<dest>.cache`` beside ``dest``: a failed build's (or ``weir plan --compute``'s) work, stages up to
    the documents (and their length stats, if reached), for the next build to reuse."""
    return dest.with_name(f".{dest.name}.cache")


def kept_work(dest: Path) -> Path | None:
    """:func:`work_cache` of ``dest`` if it holds tokenized chunks (what a failed build kept), else ``None``."""
    cache = work_cache(dest)
    return cache if _tokenized(cache) else None


def _tokenized(folder: Path) -> bool:
    return any(folder.glob("sources/*/chunks/*/report.json"))


def _keep_work(stage: Path, cache: Path) -> None:
    """Make the failed build's ``stage`` the new ``cache`` if it tokenized anything, else remove it."""
    if not _tokenized(stage):
        shutil.rmtree(stage, ignore_errors=True)
        return
    try:
        shutil.rmtree(stage / "shards", ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)  # the stage was seeded from it: nothing of use is lost
        stage.rename(cache)
    except OSError:
        shutil.rmtree(stage, ignore_errors=True)


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


def _wait_for_writers(
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


def _remove_leftovers(dest: Path, say: Callable[[str], None]) -> tuple[int, int]:
    """Remove the staging folders of dead builds beside ``dest`` (call with the lock held); (count, bytes)."""
    pattern = re.compile(rf"\.{re.escape(dest.name)}\.(building|old)-\d+")
    found = sorted(p for p in dest.parent.iterdir() if pattern.fullmatch(p.name)) if dest.parent.is_dir() else []
    olds = [p for p in found if ".old-" in p.name[len(dest.name) + 1 :]]
    if olds and not dest.exists():  # killed between the swap's two renames: the previous output is whole
        back = max(olds, key=lambda p: p.stat().st_mtime)
        back.rename(dest)
        found.remove(back)
        say(f"restored {dest} from {back.name} (a build was killed while replacing it)")
    size = 0
    for p in found:
        size += _tree_bytes(p)
        shutil.rmtree(p, ignore_errors=True)
    return len(found), size


def _swap(stage: Path, dest: Path) -> None:
    """Replace ``dest`` by ``stage`` (two renames; a kill between them is repaired by the next build)."""
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists():
        dest.rename(old)
    try:
        stage.rename(dest)
    except BaseException:
        if old.exists() and not dest.exists():
            old.rename(dest)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _tree_bytes(root: Path) -> int:
    n = 0
    for d, _dirs, files in os.walk(root):
        for f in files:
            with suppress(OSError):  # removed meanwhile
                n += os.lstat(os.path.join(d, f)).st_size
    return n


def _human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    raise AssertionError


def reuse_previous(previous: Path, stage: Path) -> int:
    """Hard-link (or copy) ``previous``'s reusable work into the empty build folder ``stage``.

    Reusable: ``sources/*/chunks/`` (tokenized chunks, keyed by file, tokenizer and spec fingerprints; a
    chunk whose files have since moved, or are reached from another folder, is found by its content key and
    renamed by the documents stage, :func:`mixing.ingest.chunk_store.relocate_chunks`, so it is seeded like any
    other) and ``tokenizer/`` (kept only if its training sample is unchanged). Returns the files linked. Seeding
    from several folders: files ``stage`` already has are kept, and ``tokenizer/`` comes from the first
    folder that has one (one tokenizer's files are never mixed with another's).
    Temporary files and folders a killed writer left (``.NAME.*.tmp``) are not carried over. Folders are
    created afresh and a file whose mode is not what the umask gives now is copied rather than linked,
    so the new build's modes follow the umask whatever the previous one's were.
    """
    n = 0
    want = file_mode()
    tok = [] if (stage / "tokenizer").exists() else [previous / "tokenizer"]
    parts = [*tok, *sorted((previous / "sources").glob("*/chunks"))]
    for src in parts:
        for d, dirs, files in os.walk(src):
            dirs[:] = [x for x in dirs if not _is_temp(x)]
            to = stage / Path(d).relative_to(previous)
            to.mkdir(parents=True, exist_ok=True)
            for f in files:
                if _is_temp(f):
                    continue
                a, b = os.path.join(d, f), to / f
                if b.exists():
                    continue
                n += 1
                try:
                    if os.stat(a).st_mode & 0o7777 != want:
                        raise OSError("mode differs")
                    os.link(a, b)
                except OSError:  # another file system, or another mode: copy (mode from the umask)
                    shutil.copyfile(a, b)
    return n


def _is_temp(name: str) -> bool:
    """A writer's temporary name (``layout.atomic_path``'s files, ``documents``' chunk folders)."""
    return name.startswith(".") and name.endswith(".tmp")
