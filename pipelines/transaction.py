"""The transaction behind ``weir build``: one build at a time per output, and never a partial output.

:func:`build_output` takes the output's lock (:mod:`pipelines.output_lock`), clears what killed builds left
beside it, builds (:func:`pipelines.build.build_mix`) into a staging folder beside the output, and swaps it in only
when the build succeeded. The staging folder is seeded with the previous output's and the kept work's tokenized
chunks and trained tokenizer, and a build that fails or is killed keeps its chunks as ``.<dest>.cache``, never
``dest`` itself, so no reader sees a partial build (:mod:`pipelines.kept_work`); ``weir plan`` plans from them in
seconds, and a successful build removes them.

A build into object storage (``dest`` an fsspec URL, :func:`build_remote`) has no folder to swap: each stage
publishes under its keys and commits last (:mod:`mixing.output.commit`), the shards' manifest is removed
before the first shard is written and written after the last, and the driver's local working folder
(:func:`assets.storage.work_folder`) is locked instead of the output.

One writer per output (the output's lock, and the Dagster UI's runs that write it) is
:mod:`pipelines.output_lock`'s.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import dagster as dg

from assets import WeirEngine
from assets.storage import work_folder
from contract.errors import WeirError
from contract.redaction import redact_url
from contract.store import Store, is_local
from mixing import Mix
from mixing.output.commit import COMMITS
from pipelines.build import build_mix, build_tags
from pipelines.failures import human
from pipelines.kept_work import adopt_killed_work, keep_work, reuse_previous, work_cache
from pipelines.lease import BuildBusy, Lease, LeaseLost, root_lease
from pipelines.outage import Outages, riding_outages, unreachable
from pipelines.output_lock import output_lock, wait_for_writers
from pipelines.resources import storage_resource

__all__ = [
    "BuildBusy",
    "BuildOutcome",
    "build_output",
    "build_remote",
]


@dataclass(frozen=True)
class BuildOutcome:
    """What :func:`build_output` did besides building: files reused, leftovers of killed builds removed, and the
    tokenized chunks of killed builds kept as the work cache (:func:`work_cache`) before seeding."""

    dest: Path | str
    reused_files: int
    leftovers: int
    leftover_bytes: int
    kept_chunks: int = 0


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
    blocks until the lock is free. Under the lock, what killed builds left beside ``dest`` is cleared: if a build
    was killed between the two renames of its swap, the previous output is put back; the tokenized chunks of a
    killed build's staging folder (``.<dest>.building-<pid>``) are kept as :func:`work_cache`, as a failed
    build's are (:func:`_adopt_killed_work`); the rest (``.<dest>.old-<pid>``, staging folders) is removed.
    The build runs in
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
        wait_for_writers(instance, mix, tags, dest, wait, say)
        n, size, kept = _remove_leftovers(dest, say)
        if n:
            say(f"removed {n} leftover{'s' if n > 1 else ''} of killed builds ({human(size)})")
        stage = dest.with_name(f".{dest.name}.building-{os.getpid()}")
        try:
            reused = 0
            if not fresh:  # the newest work first: a failed build's tokenizer wins over the output's
                reused += reuse_previous(cache, stage) if cache.is_dir() else 0
                reused += reuse_previous(dest, stage) if dest.is_dir() else 0
                base = Path(mix.continues.base) if mix.continues is not None and is_local(mix.continues.base) else None
                reused += reuse_previous(base, stage) if base is not None and base.is_dir() else 0
            if cache.is_dir() and not fresh:
                who = "killed" if kept else "failed"
                say(f"reusing the work a {who} build kept in {cache} ({reused} files with the output's)")
            build_mix(mix, stage, say=say, instance=instance, engine=engine, tags=tags)
            # a run the UI launched just before this build took the lock may be writing dest: let it finish
            wait_for_writers(instance, mix, tags, dest, True, say)
            _swap(stage, dest)
        except BaseException:
            keep_work(stage, cache)
            raise
        shutil.rmtree(cache, ignore_errors=True)  # its chunks live on in dest (or were stale)
    return BuildOutcome(dest, reused, n, size, kept)


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
            wait_for_writers(instance, mix, tags, store.url, wait, say)
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


def _remove_leftovers(dest: Path, say: Callable[[str], None]) -> tuple[int, int, int]:
    """Clear what dead builds left beside ``dest`` (call with the lock held): put back an output a build was killed
    while replacing, keep killed builds' tokenized chunks (:func:`_adopt_killed_work`), remove the rest;
    (folders removed, their bytes, chunks kept)."""
    pattern = re.compile(rf"\.{re.escape(dest.name)}\.(building|old)-\d+")
    found = sorted(p for p in dest.parent.iterdir() if pattern.fullmatch(p.name)) if dest.parent.is_dir() else []
    olds = [p for p in found if ".old-" in p.name[len(dest.name) + 1 :]]
    if olds and not dest.exists():  # killed between the swap's two renames: the previous output is whole
        back = max(olds, key=lambda p: p.stat().st_mtime)
        back.rename(dest)
        found.remove(back)
        say(f"restored {dest} from {back.name} (a build was killed while replacing it)")
    adopted, kept = adopt_killed_work([p for p in found if p not in olds], work_cache(dest), say)
    found = [p for p in found if p != adopted]
    size = 0
    for p in found:
        size += _tree_bytes(p)
        shutil.rmtree(p, ignore_errors=True)
    return len(found), size, kept


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
