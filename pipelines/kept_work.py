"""The work a build keeps and reuses: tokenized chunks and a trained tokenizer, never a partial write.

A build that fails or is killed leaves its tokenized chunks behind as the hidden sibling ``.<dest>.cache``
(:func:`work_cache`): a failed build makes its staging folder the cache (:func:`keep_work`); a killed one's
staging folder is adopted by the next build (:func:`adopt_killed_work`: only chunks published whole, the larger
work kept, the other's chunks moved in). A build seeds its fresh staging folder from the previous output and the
cache with hard links (:func:`reuse_previous`; those files are only ever replaced, never written in place), and
the documents stage verifies every reused chunk against its checksums, so a chunk a dying machine wrote half
is tokenized again.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from contract.atomic import file_mode
from pipelines.failures import human

__all__ = ["adopt_killed_work", "keep_work", "kept_work", "reuse_previous", "work_cache"]


def work_cache(dest: Path) -> Path:
    """``.<dest>.cache`` beside ``dest``: a failed or killed build's (or ``weir plan --compute``'s) work, stages up
    to the documents (and their length stats, if reached), for the next build to reuse."""
    return dest.with_name(f".{dest.name}.cache")


def kept_work(dest: Path) -> Path | None:
    """:func:`work_cache` of ``dest`` if it holds tokenized chunks (what a failed build kept), else ``None``."""
    cache = work_cache(dest)
    return cache if _tokenized(cache) else None


def _tokenized(folder: Path) -> bool:
    return any(not _is_temp(p.parent.name) for p in folder.glob("sources/*/chunks/*/report.json"))


def _chunks(folder: Path) -> dict[Path, int]:
    """``folder``'s complete chunks (published under their key, ``report.json`` in), relative, with the bytes of
    their tokens. A writer's temporary folder (:func:`_is_temp`) is no chunk, whatever it holds."""
    found = {}
    for report in folder.glob("sources/*/chunks/*/report.json"):
        if not _is_temp(report.parent.name):
            with suppress(OSError):
                found[report.parent.relative_to(folder)] = (report.parent / "tokens.bin").stat().st_size
    return found


def keep_work(stage: Path, cache: Path) -> None:
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


def adopt_killed_work(stages: list[Path], cache: Path, say: Callable[[str], None]) -> tuple[Path | None, int]:
    """Keep the tokenized chunks of killed builds' staging folders ``stages`` as the work ``cache``; (the stage
    that became ``cache``, if one did; the chunks ``cache`` holds), (None, 0) when no stage had a chunk.

    Only what a writer published whole is kept: a chunk is renamed into ``chunks/<key>`` after its files and
    last its ``report.json`` are written, so a chunk the kill interrupted is a temporary folder (:func:`_is_temp`).
    Of ``cache`` and the stages, the one with the most tokens becomes ``cache`` (a stage less its shards, its
    temporary files and a tokenizer whose JSON does not parse: :func:`_tidy`), and the others' chunks it lacks
    are moved into it (whole folders, renamed); the others are left for the caller to remove. Bytes a machine
    that died never wrote back are not trusted either: the next build verifies every reused chunk against its
    checksums (:mod:`mixing.ingest.chunks`) and tokenizes a damaged one again."""
    folders = [f for f in (cache, *stages) if f.is_dir() and _chunks(f)]
    if not any(f != cache for f in folders):
        return None, 0
    best = max(folders, key=lambda f: sum(_chunks(f).values()))
    for other in (f for f in folders if f != best):
        for rel in set(_chunks(other)) - set(_chunks(best)):
            with suppress(OSError):  # another file system, say: that chunk is tokenized again
                (best / rel).parent.mkdir(parents=True, exist_ok=True)
                (other / rel).rename(best / rel)
    if best != cache:
        try:
            _tidy(best)
            shutil.rmtree(cache, ignore_errors=True)
            best.rename(cache)
        except OSError:  # the work is lost, never the build: it tokenizes again
            return None, 0
    chunks = _chunks(cache)
    killed = "killed builds" if len(folders) - (cache in folders) > 1 else "a killed build"
    n = f"{len(chunks)} chunk{'s' if len(chunks) != 1 else ''}"
    say(f"kept the tokenized work of {killed} in {cache} ({n}, {human(sum(chunks.values()))})")
    return (best if best != cache else None), len(chunks)


def _tidy(stage: Path) -> None:
    """Remove a killed build's shards, its writers' temporary files, and a tokenizer whose JSON files do not parse."""
    shutil.rmtree(stage / "shards", ignore_errors=True)
    for d, dirs, files in os.walk(stage):
        for name in [x for x in dirs if _is_temp(x)]:
            shutil.rmtree(os.path.join(d, name), ignore_errors=True)
            dirs.remove(name)
        for name in filter(_is_temp, files):
            with suppress(OSError):
                os.unlink(os.path.join(d, name))
    for f in (stage / "tokenizer").glob("*.json"):
        try:
            json.loads(f.read_bytes())
        except (OSError, ValueError):
            shutil.rmtree(stage / "tokenizer", ignore_errors=True)
            break


def reuse_previous(previous: Path, stage: Path) -> int:
    """Hard-link (or copy) ``previous``'s reusable work into the empty build folder ``stage``.

    Reusable: ``sources/*/chunks/`` (tokenized chunks, keyed by file, tokenizer and spec fingerprints; a
    chunk whose files have since moved, or are reached from another folder, is found by its content key and
    renamed by the documents stage, :func:`mixing.ingest.relocation.relocate_chunks`, so it is seeded like any
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
