"""The node's index of a local build: made once per node, memory-mapped by every rank and DataLoader worker.

A loader needs every sequence's step, real tokens and document boundaries (the planner plans steps from
them, the chunk builder cuts items with them). Read from the shards' ``meta.npz`` files, they would be
copied into every process (about 90 bytes per segment: tens of GB per worker at 10^10 segments); the
index (:mod:`contract.index`) holds them once as plain ``.npy`` files that the page cache shares.

The index of a build lives in ``<cache_dir>/index/<sha256 of the manifest>.v<index version>/``: the manifest's
bytes fix every meta file's sha256, so one index serves every copy of the build, and loaders of two index
versions on one node (two jobs of different weir releases) each keep their own rather than remaking each
other's. The first process on the node to open the build makes it under an exclusive lock (others wait, then
map it): into a temporary folder, ``index.json`` last, renamed into place whole. Its files are checked like
shard files (:mod:`loaders.integrity`): sizes always; with ``verify`` each file's sha256 against ``index.json``,
once per node (the verdict kept as a marker), and an index made from meta files nobody verified is made again
from verified ones. A damaged or foreign index is made again (with a warning naming it), never served; a
``cache_dir`` that cannot be written leaves the build on the shards' own metadata (with a warning).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

from contract.errors import first_line
from contract.index import ARRAYS, INDEX, INDEX_VERSION, write_index
from contract.manifest import ShardFile
from contract.shards import ShardError
from loaders.integrity import CorruptShardError, VerifiedShardSet

__all__ = ["index_folder", "open_index"]


def index_folder(cache_dir: Path, manifest_bytes: bytes) -> Path:
    """Where the node's index (of this loader's index version) of the build with this manifest lives."""
    return cache_dir / "index" / f"{hashlib.sha256(manifest_bytes).hexdigest()[:32]}.v{INDEX_VERSION}"


def open_index(shards: VerifiedShardSet, cache_dir: Path) -> Path | None:
    """Make ``shards`` serve its metadata from the node's index (made first if this node has none sound),
    and return the index folder; None when ``cache_dir`` cannot hold one (the shards' metadata is used)."""
    folder = index_folder(cache_dir, shards.manifest_bytes)
    digest = hashlib.sha256(shards.manifest_bytes).hexdigest()
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(folder.parent / f"{folder.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        warnings.warn(
            f"{folder}: cannot keep the build's index there ({e}); reading every shard's metadata", stacklevel=3
        )
        return None
    with os.fdopen(lock, "r+b") as f:
        fcntl.lockf(f, fcntl.LOCK_EX)  # released on close: one process makes it, the others wait for it
        problem = _problem(folder, digest, shards)
        if problem is not None:
            if problem:
                warnings.warn(f"{problem}; making the build's index again", stacklevel=3)
            _make(folder, digest, shards)
    shards.use_index(folder)
    return folder


def _record(folder: Path) -> dict[str, Any]:
    return json.loads((folder / INDEX).read_text())


def _problem(folder: Path, digest: str, shards: VerifiedShardSet) -> str | None:
    """None when ``folder`` holds a sound index of this build; "" when there is none; else what is wrong."""
    if not (folder / INDEX).exists():
        return ""
    try:
        record = _record(folder)
        files = {name: ShardFile.model_validate(f) for name, f in record["files"].items()}
        if record["index_version"] != INDEX_VERSION or record["manifest_sha256"] != digest or set(files) != set(ARRAYS):
            return f"{folder / INDEX}: of another index version or build"
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{folder / INDEX}: unreadable ({first_line(e)})"
    verifier = shards.verifier
    if verifier is not None and not record.get("meta_verified"):
        return ""  # made by a process that trusted the shards' metadata unverified: make it again, verified
    try:
        for name in ARRAYS:
            path = folder / f"{name}.npy"
            if verifier is None:
                _check_size(path, files[name])
            else:
                verifier.verify(path, files[name], records=INDEX)
    except CorruptShardError as e:
        return str(e)
    return None


def _check_size(path: Path, f: ShardFile) -> None:
    """Raise :class:`CorruptShardError` unless ``path`` has the size ``index.json`` records."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise CorruptShardError(f"{path}: missing; index.json records {f.bytes} bytes") from None
    if size != f.bytes:
        raise CorruptShardError(f"{path}: {size} bytes, index.json records {f.bytes}")


def _make(folder: Path, digest: str, shards: VerifiedShardSet) -> None:
    """Write the index into a fresh temporary folder, then swap it in for whatever ``folder`` held."""
    tmp = folder.parent / f".{folder.name}.{os.getpid()}.tmp"
    old = folder.parent / f".{folder.name}.{os.getpid()}.old"
    for path in folder.parent.glob(f".{folder.name}.*"):  # left by a killed maker (the lock is ours now)
        shutil.rmtree(path, ignore_errors=True)
    tmp.mkdir()
    try:
        record = write_index(shards, tmp, digest, meta_verified=shards.verifier is not None)
    except ShardError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if folder.exists():
        folder.rename(old)
    tmp.rename(folder)
    shutil.rmtree(old, ignore_errors=True)
    if shards.verifier is not None:
        for name in ARRAYS:  # just hashed while writing: no process on this node need hash them again
            shards.verifier.vouch(folder / f"{name}.npy", ShardFile.model_validate(record["files"][name]))
