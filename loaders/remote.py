"""Builds on object storage (``s3://…`` or any fsspec URI), streamed through a bounded local cache.

A shard's files are fetched whole (under a temporary name, size and sha256 checked against the manifest,
then renamed) the first time one of its sequences is read, and memory-mapped like a local build; a file
already in the cache is hashed before use like a local one (:mod:`loaders.integrity`). When
fetching would push the cache past ``cache_bytes``, the least recently used shards are deleted first (a
mapping still open stays valid on POSIX; the shard is fetched again if read again). The bound holds per
process: each DataLoader worker gets its own sub-folder, so no process deletes a file another is opening.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fsspec
import numpy as np

from contract.atomic import atomic_path
from contract.manifest import ShardFile
from contract.shards import ShardError, ShardSet, sha256_file
from loaders.integrity import CorruptShardError, VerifiedShardSet, Verifier

__all__ = ["RemoteShardSet", "open_remote"]


class RemoteShardSet(VerifiedShardSet):
    """A :class:`~contract.shards.ShardSet` whose shard files live at ``remote`` on ``fs`` and are cached in
    ``local`` (which holds ``manifest.json``), at most ``cache_bytes`` of shard files at a time. Fetched
    files are always checked; ``verifier`` (None: off) checks those found already in the cache."""

    streamed = True

    def __init__(self, local: Path, fs: Any, remote: str, cache_bytes: int, verifier: Verifier | None) -> None:
        super().__init__(local, verifier)
        self.fs, self.remote, self.cache_bytes = fs, remote.rstrip("/"), cache_bytes
        self._cached: OrderedDict[int, int] = OrderedDict()  # shard → bytes on disk, least recent first
        self._pid = os.getpid()
        need = max((self._shard_bytes(k) for k in range(len(self.manifest.shards))), default=0)
        if need > cache_bytes:
            raise ShardError(f"cache_bytes {cache_bytes} is smaller than one shard ({need} bytes) of {remote}")

    @property
    def steps(self) -> np.ndarray:  # type: ignore[override]
        """Step of every sequence from the manifest when it is regular (no shard fetched), else by reading."""
        m = self.manifest
        if m.steps is not None and m.global_batch is not None and m.sequences == m.steps * m.global_batch:
            return np.repeat(np.arange(m.steps, dtype=np.int64), m.global_batch)
        return super().steps

    def cached_bytes(self) -> int:
        """Bytes of shard files in the local cache now."""
        return sum(self._cached.values())

    def _shard_bytes(self, k: int) -> int:
        return sum(f.bytes for f in self.manifest.shards[k].files.both())

    def _own_folder(self) -> None:
        """In a forked or spawned worker, move to a sub-folder of this process (see the module docstring)."""
        if os.getpid() != self._pid:
            manifest = (self.dir / "manifest.json").read_bytes()
            mine = self.dir.parent / str(os.getpid())
            mine.mkdir(parents=True, exist_ok=True)
            (mine / "manifest.json").write_bytes(manifest)
            ShardSet.__init__(self, mine)  # re-open every reader state on the new folder
            self._pid, self._cached, self._ready = os.getpid(), OrderedDict(), set()
            # async filesystems (s3fs) are not fork-safe: a fresh instance, not the parent's cached one
            self.fs = type(self.fs)(**self.fs.storage_options, skip_instance_cache=True)

    def _shard(self, k: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self._own_folder()
        if k in self._cached:
            self._cached.move_to_end(k)
        else:
            need = self._shard_bytes(k)
            while self._cached and self.cached_bytes() + need > self.cache_bytes:
                self._evict(next(iter(self._cached)))
            for f in self.manifest.shards[k].files.both():
                self._fetch(f)
            self._cached[k] = need
        return super()._shard(k)

    def _fetch(self, f: ShardFile) -> None:
        dest = self.dir / f.name
        if dest.exists() and dest.stat().st_size == f.bytes:
            return
        url = f"{self.remote}/{f.name}"
        with atomic_path(dest) as tmp:
            self.fs.get(url, str(tmp))
            size, name = tmp.stat().st_size, self.fs.unstrip_protocol(url)  # s3://bucket/…, as the user wrote it
            if size != f.bytes:
                raise CorruptShardError(
                    f"{name}: {size} bytes, the manifest records {f.bytes} (truncated or rewritten)"
                )
            digest = sha256_file(tmp)
            if digest != f.sha256:
                raise CorruptShardError(
                    f"{name}: sha256 {digest}, the manifest records {f.sha256} (damaged shard file)"
                )
        if self.verifier is not None:
            self.verifier.trust(dest, f)  # just hashed

    def _evict(self, k: int) -> None:
        self._cached.pop(k)
        self._ready.discard(k)
        self._open.pop(k, None)
        for f in self.manifest.shards[k].files.both():
            (self.dir / f.name).unlink(missing_ok=True)


def open_remote(
    uri: str,
    cache_dir: Path,
    cache_bytes: int,
    storage_options: Mapping[str, Any] | None = None,
    verifier: Verifier | None = None,
) -> tuple[RemoteShardSet, bytes]:
    """The shards of the build at ``uri`` (a build folder or its ``shards`` folder) and the manifest's bytes.

    The cache lives in ``cache_dir`` under the manifest's sha256 and this
    process's id; ``verifier`` checks files found there before use (None: trusted by their size).
    """
    fs, root = fsspec.core.url_to_fs(uri, **(storage_options or {}))
    root = root.rstrip("/")
    for base in (f"{root}/shards", root):
        if fs.exists(f"{base}/manifest.json"):
            break
    else:
        raise ShardError(f"{uri}: no manifest.json here or under shards/; the build is missing or did not finish")
    manifest = fs.cat_file(f"{base}/manifest.json")
    digest = hashlib.sha256(manifest).hexdigest()
    local = cache_dir / digest[:16] / str(os.getpid())
    local.mkdir(parents=True, exist_ok=True)
    with atomic_path(local / "manifest.json") as tmp:
        tmp.write_bytes(manifest)
    return RemoteShardSet(local, fs, base, cache_bytes, verifier), manifest
