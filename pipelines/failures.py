"""Why a build failed, in one line: what ``weir build`` prints as ``build failed: …``.

:func:`explain` takes what a build raised and the output it was building, and returns a :class:`Failure`: the
error under Dagster's wrappers (:func:`original`), the stage it failed in (:func:`stage_of`), its kind (one of
:data:`KINDS`) and the line, which names the path, the stage and the next step. A failed build keeps its
tokenized work beside the output (``.NAME.cache``, :func:`pipelines.kept_work.work_cache`); when that work
holds space on the file system that ran out, the line names it, its size and how to remove it.

Kinds are told by the error's type names, its ``errno`` (or the ``os error N`` / ``[Errno N]`` its text quotes:
polars and DuckDB report a full disk in their own exception types) and the file system's state (``statvfs``):
``no_inodes`` is a full disk whose bytes are not all used while (almost) no inode is free. Nothing is imported
that the failure may have come from, so a process out of memory can still say so.
"""

from __future__ import annotations

import errno
import os
import re
import resource
import traceback
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from contract.errors import first_line
from mixing.mixfile.envvars import redact

__all__ = [
    "KINDS",
    "MEMORY_SETTINGS",
    "Failure",
    "address_limit",
    "explain",
    "human",
    "memory_line",
    "original",
    "stage_of",
]

KINDS = ("disk_full", "no_inodes", "quota", "read_only", "permission", "busy", "ray_head", "memory", "error")
"""What a failure can be; ``error`` is any other (the error's own type and message)."""

MEMORY_SETTINGS: dict[str, str] = {
    "starting": "weir build's libraries and threads take about 0.9 GB of address space before any stage: raise "
    "the limit",
    "source_index": "raise the limit (the stage holds one source's file list; its threads: POLARS_MAX_THREADS)",
    "tokenizer": "raise the limit, or lower tokenizer.sample_bytes in the mix file (the training sample the stage "
    "holds) or RAYON_NUM_THREADS",
    "documents": "raise the limit, or lower RAYON_NUM_THREADS (each tokenizer thread holds part of one chunk of "
    "~16 MB of text) or POLARS_MAX_THREADS",
    "length_stats": "raise the limit, or lower WEIR_DUCKDB_MEMORY_LIMIT (what DuckDB may hold) and WEIR_DUCKDB_THREADS",
    "plan": "raise the limit, or lower WEIR_DUCKDB_MEMORY_LIMIT (what DuckDB may hold) and WEIR_DUCKDB_THREADS",
    "packed_shards": "raise the limit, or lower WEIR_DUCKDB_MEMORY_LIMIT (DuckDB's pages, beside one shard of "
    "~64 MB of tokens)",
}
"""Per stage (and ``starting``: the imports), what it holds and the setting that bounds it (docs/operations.md)."""

# the names of mixing.stages.STAGES (a test checks): that module imports what a failure may have come from
_STAGE_NAMES = {"source_index", "tokenizer", "documents", "length_stats", "plan", "packed_shards"}
# stage functions (mixing/stages.py) and the transaction's steps (pipelines/transaction.py), for errors that
# carry no Dagster step: raised before the run, after it, or in a process that has no run
_FRAMES = {
    ("stages.py", "index"): "source_index",
    ("stages.py", "prepare_tokenizer"): "tokenizer",
    ("stages.py", "tokenize"): "documents",
    ("stages.py", "tokenize_ahead"): "documents",
    ("stages.py", "length_stats"): "length_stats",
    ("stages.py", "plan"): "plan",
    ("stages.py", "pack"): "packed_shards",
    ("output_lock.py", "output_lock"): "taking the output's lock",
    ("transaction.py", "_remove_leftovers"): "removing what killed builds left",
    ("kept_work.py", "reuse_previous"): "seeding from the previous output",
    ("transaction.py", "_swap"): "replacing the output",
}
_ERRNO_TEXT = re.compile(r"\(os error (\d+)\)|\[Errno (\d+)\]|Os \{ code: (\d+)")
_ERRNO_PHRASES = {
    "no space left on device": errno.ENOSPC,
    "disk quota exceeded": errno.EDQUOT,
    "read-only file system": errno.EROFS,
    "permission denied": errno.EACCES,
    "cannot allocate memory": errno.ENOMEM,
}
_MEMORY_TYPES = {"MemoryError", "OutOfMemoryException", "ArrowMemoryError", "OutOfMemoryError"}
_MEMORY_TEXT = re.compile(
    r"out of memory|memory allocation of \d+ bytes failed|failed to map segment|can't start new thread|"
    r"could not spawn threads|can't spawn worker thread|failed to launch worker thread|bad allocation|"
    r"malloc of size \d+ failed|bad_alloc|outofmemoryerror|threadpoolbuilderror",
    re.IGNORECASE,
)
_RAY_HEAD_TEXT = re.compile(r"failed to connect to gcs|no ray cluster at|gcs .*(unavailable|died)", re.IGNORECASE)
_DUCKDB_OWN_LIMIT = re.compile(r"\(([\d.]+ \w+)/([\d.]+ \w+) used\)")  # "(1.1 MiB/1.9 MiB used)"
_QUOTED_PATH = re.compile(r"[\"'](/[^\"']+)[\"']")


@dataclass(frozen=True)
class Failure:
    """One failed build: ``kind`` (:data:`KINDS`), ``stage`` (``documents [qa]``, ``replacing the output``, or
    None when unknown), ``line`` (what follows ``build failed: ``; one line) and the ``error`` it explains."""

    kind: str
    stage: str | None
    line: str
    error: BaseException


def original(e: BaseException) -> BaseException:
    """The error a stage raised, under Dagster's wrappers: ``user_exception`` of a step error, followed down."""
    seen: set[int] = set()
    while getattr(e, "user_exception", None) is not None and id(e) not in seen:
        seen.add(id(e))
        e = e.user_exception  # type: ignore[attr-defined]
    return e


def _chain(e: BaseException) -> Iterator[BaseException]:
    """``e``, what it wraps and what it was raised from or during, each once."""
    todo, seen = [e], set[int]()
    while todo:
        x = todo.pop(0)
        if id(x) in seen:
            continue
        seen.add(id(x))
        yield x
        todo += [y for y in (getattr(x, "user_exception", None), x.__cause__, x.__context__) if y is not None]


def stage_of(e: BaseException, said: str | None = None) -> str | None:
    """The stage ``e`` was raised in: a Dagster step's op (``documents__qa`` → ``documents [qa]``), else a stage
    function or a step of the transaction among its frames, else ``said`` (the last stage the build announced)."""
    for x in _chain(e):
        op = getattr(x, "op_name", None)
        if isinstance(op, str):
            head, _, rest = op.partition("__")
            if head in _STAGE_NAMES:
                return f"{head} [{rest}]" if rest else head
            if rest.split("__")[0] in _STAGE_NAMES:  # an asset's own op: <mix>__<stage>
                return rest.split("__")[0]
    for x in _chain(e):
        for frame in reversed(traceback.extract_tb(x.__traceback__)):
            found = _FRAMES.get((Path(frame.filename).name, frame.name))
            if found is not None:
                return found
    return said


def address_limit() -> int | None:
    """This process's address-space limit in bytes (``ulimit -v``, RLIMIT_AS), or None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY else soft


def human(n: float) -> str:
    """Bytes as ``12.3 MB`` (powers of 1000)."""
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


def explain(error: BaseException, dest: Path | str, *, said: str | None = None, cache: Path | None = None) -> Failure:
    """The :class:`Failure` of a build of ``dest`` that raised ``error``.

    ``said``: the last stage the build announced (used when the error names none); ``cache``: the work the
    failed build kept beside ``dest`` (:func:`pipelines.kept_work.kept_work`), named with its size where it
    holds the space that ran out. Deterministic for a given error and file-system state."""
    if isinstance(dest, str) and "://" in dest:  # an object-store root: never its credentials
        from contract.redaction import redact_url

        dest = redact_url(dest)
    e = original(error)
    stage = stage_of(error, said)
    where = _where(stage)
    path = _path(e, dest)
    code = _errno(e)
    names = {c.__name__ for c in type(e).__mro__}
    if code in (errno.ENOSPC, errno.EDQUOT):
        fs, st = _statvfs(path)
        path = _on_output(path, fs, dest)
        if code == errno.EDQUOT:
            return Failure(
                "quota",
                stage,
                f"disk quota exceeded writing {path}{where}: free space under your quota (or build elsewhere: "
                f"--out DIR), then run the build again{_kept(cache, fs)}",
                e,
            )
        if (
            st is not None
            and st.f_files
            and (
                st.f_favail == 0 or (st.f_bavail * st.f_frsize > 1 << 20 and st.f_favail <= max(16, st.f_files // 1000))
            )
        ):
            return Failure(
                "no_inodes",
                stage,
                f"no free inodes on the file system of {path} ({st.f_files:,} inodes, "
                f"{st.f_favail} free; {human(st.f_bavail * st.f_frsize)} of space free){where}: remove files there "
                f"(or build elsewhere: --out DIR), then run the build again{_kept(cache, fs, 'those inodes')}",
                e,
            )
        free = f" ({human(st.f_bavail * st.f_frsize)} free of {human(st.f_blocks * st.f_frsize)})" if st else ""
        return Failure(
            "disk_full",
            stage,
            f"no space left on the file system of {path}{free}{where}: free space there (or build elsewhere: "
            f"--out DIR), then run the build again{_kept(cache, fs)}",
            e,
        )
    if code == errno.EROFS:
        fs, _ = _statvfs(path)
        shown = _on_output(path, fs, dest)
        return Failure(
            "read_only",
            stage,
            f"{shown} is on a read-only file system ({path} could not be written){where}: build into a writable "
            "folder (--out DIR), or mount it read-write",
            e,
        )
    if code in (errno.EACCES, errno.EPERM) or (code == errno.ENOENT and _unwritable_lock(path)):
        folder = path.parent if code == errno.ENOENT and isinstance(path, Path) else path
        return Failure(
            "permission",
            stage,
            f"permission denied writing {folder}{where}: make it writable for user "
            f"{_user()}, or build elsewhere (--out DIR)",
            e,
        )
    if code == errno.EBUSY and isinstance(dest, Path) and str(dest) in str(e):
        return Failure(
            "busy",
            stage,
            f"{dest} cannot be replaced (a mount point, or in use){where}: build into a "
            f"folder inside it (--out {dest / dest.name}) or elsewhere{_kept(cache)}",
            e,
        )
    if "RayHeadLost" in names or "RpcError" in names or _RAY_HEAD_TEXT.search(str(e)):
        return Failure(
            "ray_head",
            stage,
            f"{first_line(e)}{where}: start the Ray cluster again (or point "
            "--ray-address / WEIR_RAY_ADDRESS at a live head), then run the build again" + _kept(cache),
            e,
        )
    own = _DUCKDB_OWN_LIMIT.search(str(e)) if "OutOfMemoryException" in names else None
    if own is not None:  # DuckDB's own memory_limit, not the process's: it is the setting to raise
        return Failure(
            "memory",
            stage,
            f"DuckDB reached its memory limit ({own.group(2)}){where} building {dest}: raise "
            f"WEIR_DUCKDB_MEMORY_LIMIT (or lower WEIR_DUCKDB_THREADS){_kept(cache)}",
            e,
        )
    short = next((x for x in _chain(e) if _out_of_memory(x)), None)
    if short is not None:
        return Failure("memory", stage, memory_line(stage, first_line(short), dest) + _kept(cache), e)
    return Failure("error", stage, redact(f"{type(e).__name__}: {e}"), e)


def memory_line(stage: str | None, what: str, dest: Path | str | None = None) -> str:
    """The line of a build of ``dest`` out of memory in ``stage`` (``what``: how it showed): the address-space
    limit when one is set, and what the stage holds and the setting that bounds it (:data:`MEMORY_SETTINGS`)."""
    limit = address_limit()
    under = f" under the address-space limit of {limit >> 20} MB (ulimit -v)" if limit is not None else ""
    key = (stage or "starting").split(" [")[0]
    hint = MEMORY_SETTINGS.get(key, "raise the memory limit")
    where = _where(stage) or " while starting"
    into = f" building {dest}" if dest is not None else ""
    return f"out of memory{where}{into}{under} ({what}): {hint}"


def _where(stage: str | None) -> str:
    """`` in stage documents [qa]``, `` while replacing the output``, or nothing."""
    if stage is None:
        return ""
    return f" in stage {stage}" if stage.split(" [")[0] in _STAGE_NAMES else f" while {stage}"


def _on_output(path: Path | str, fs: Path | None, dest: Path | str) -> Path | str:
    """``dest`` where ``path`` (a file the build wrote) is on its file system: the staging folder it was in is
    gone by now (kept as the cache, or removed), the output folder is what the user named."""
    out, _ = _statvfs(dest)
    try:
        same = fs is not None and out is not None and os.stat(fs).st_dev == os.stat(out).st_dev
    except OSError:
        return path
    return dest if same else path


def _out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` says memory ran out: its type (``MemoryError``, DuckDB's, Arrow's, a Ray task's), ENOMEM, a
    thread that could not start (EAGAIN), or the words native libraries use (a library that could not be mapped,
    a failed allocation, a thread pool that could not be built)."""
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & _MEMORY_TYPES) or _errno(e) in (errno.ENOMEM, errno.EAGAIN) or bool(_MEMORY_TEXT.search(str(e)))


def _errno(e: BaseException) -> int | None:
    if isinstance(e, OSError) and e.errno:
        return e.errno
    text = str(e)
    m = _ERRNO_TEXT.search(text)
    if m:
        return int(next(g for g in m.groups() if g))
    low = text.lower()
    return next((n for phrase, n in _ERRNO_PHRASES.items() if phrase in low), None)


def _path(e: BaseException, dest: Path | str) -> Path | str:
    """The path the error names (an OSError's file, a quoted absolute path), else ``dest``."""
    name = getattr(e, "filename", None)
    if isinstance(name, str | os.PathLike) and str(name):
        return Path(name)
    m = _QUOTED_PATH.search(str(e))
    return Path(m.group(1)) if m else dest


def _statvfs(path: Path | str) -> tuple[Path | None, os.statvfs_result | None]:
    """The nearest existing folder at or above ``path`` and its file system's figures (None: not a local path)."""
    if not isinstance(path, Path):
        return None, None
    for p in (path, *path.parents):
        try:
            return p, os.statvfs(p)
        except OSError:
            continue
    return None, None


def _kept(cache: Path | None, fs: Path | None = None, what: str = "that space") -> str:
    """``; the failed build's work is kept in …`` when ``cache`` exists: with its size, and, when it is on the
    file system of ``fs`` (the one that ran out), that it holds part of that space and how to remove it."""
    if cache is None or not cache.is_dir():
        return ""
    size = 0
    for d, _dirs, files in os.walk(cache):
        for f in files:
            with suppress(OSError):  # removed meanwhile
                size += os.lstat(os.path.join(d, f)).st_blocks * 512
    kept = f"; the failed build's work is kept in {cache} ({human(size)})"
    try:
        holds = fs is not None and os.stat(cache).st_dev == os.stat(fs).st_dev
    except OSError:
        holds = False
    if holds:
        return f"{kept} and holds some of {what}: the next build reuses it, or `rm -rf {cache}` frees it"
    return f"{kept}: the next build reuses it"


def _unwritable_lock(path: Path | str) -> bool:
    """A lock file that could not be created because its folder may not be written (the lock's fallback)."""
    return isinstance(path, Path) and path.name.endswith(".lock") and not os.access(path.parent, os.W_OK)


def _user() -> str:
    import pwd

    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())
