"""Builds on object storage (``s3://…`` or any fsspec URI), streamed through one bounded cache per node.

A shard's files are fetched whole (under a temporary name, size and sha256 checked against the manifest,
then renamed) the first time one of its sequences is read, and memory-mapped like a local build. The cache
folder ``<cache_dir>/<build>/`` is the node's, shared by every process and DataLoader worker reading that
build: a shard is fetched by one of them (a lock per shard, ``flock``, released by the kernel even when its
holder is killed) and read by all, across restarts too; a file already there is hashed once per node
(:mod:`loaders.integrity`'s markers). The folder holds at most ``cache_bytes`` of shard files in all: before
it fetches, a process evicts the shards used least recently (a stamp per shard, touched on use) that no process
is fetching; a file another process has mapped stays readable (POSIX), and each process also keeps at most
``cache_bytes`` of shards mapped itself, so deleted files do not pin the disk for long.

Faults end in one line: a shard that cannot be fetched for ``outage_s`` seconds (an endpoint outage, a cut
network) is a :class:`~contract.shards.ShardError` naming the build (shorter outages are waited out with
backoff); a full disk names ``cache_dir`` and ``cache_bytes``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import fsspec
import numpy as np

from contract.atomic import atomic_path
from contract.errors import first_line
from contract.manifest import ShardFile
from contract.shards import ShardError, sha256_file
from loaders.integrity import CorruptShardError, VerifiedShardSet, Verifier

__all__ = ["OUTAGE_S", "RemoteShardSet", "open_remote"]

OUTAGE_S = 60.0  # seconds a fetch keeps retrying through an outage before it fails
_FULL = {errno.ENOSPC, errno.EDQUOT}


class RemoteShardSet(VerifiedShardSet):
    """A :class:`~contract.shards.ShardSet` whose shard files live at ``remote`` on ``fs`` and are cached in
    the node's folder ``local`` (which holds ``manifest.json``), at most ``cache_bytes`` of shard files in all.
    Fetched files are always checked; ``verifier`` (None: off) checks those found already in the cache."""

    streamed = True

    def __init__(
        self,
        local: Path,
        fs: Any,
        remote: str,
        cache_bytes: int,
        verifier: Verifier | None,
        outage_s: float = OUTAGE_S,
    ) -> None:
        super().__init__(local, verifier)
        self.fs, self.remote, self.cache_bytes, self.outage_s = fs, remote.rstrip("/"), cache_bytes, outage_s
        self._mapped: OrderedDict[int, int] = OrderedDict()  # shards this process maps → bytes, least recent first
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
        """Bytes of shard files in the node's cache folder now (every process's)."""
        return sum(size for _k, size, _t in self._on_disk())

    def _shard_bytes(self, k: int) -> int:
        return sum(f.bytes for f in self.manifest.shards[k].files.both())

    def _after_fork(self) -> None:
        """In a forked or spawned worker: a fresh filesystem (async filesystems such as s3fs are not fork-safe)
        and no mappings of the parent's (the folder is the node's, shared)."""
        if os.getpid() != self._pid:
            self._pid, self._mapped, self._ready, self._open = os.getpid(), OrderedDict(), set(), {}
            self.fs = type(self.fs)(**self.fs.storage_options, skip_instance_cache=True)

    @contextlib.contextmanager
    def _locked(self, k: int, wait: bool = True) -> Iterator[bool]:
        """Hold shard ``k``'s lock (``flock`` on ``.shard-k.lock``); yields False when ``wait`` is off and another
        process holds it."""
        fd = os.open(self.dir / f".shard-{k:05d}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock

    def _stamp(self, k: int) -> Path:
        return self.dir / f".shard-{k:05d}.used"

    def _shard(self, k: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        self._after_fork()
        if k in self._mapped:
            self._mapped.move_to_end(k)
            return super()._shard(k)
        need = self._shard_bytes(k)
        while self._mapped and sum(self._mapped.values()) + need > self.cache_bytes:
            self._unmap(next(iter(self._mapped)))
        files = self.manifest.shards[k].files.both()
        if not all((self.dir / f.name).is_file() for f in files):  # to be fetched: make room first
            self._evict(need, keep=k)
        with self._locked(k):  # one fetcher per shard on the node; no evictor deletes it until it is mapped
            for f in files:
                self._fetch(f)
            self._stamp(k).touch()
            out = super()._shard(k)
        self._mapped[k] = need
        return out

    def _on_disk(self) -> list[tuple[int, int, float]]:
        """(shard, bytes of its files here, last use) of every shard with files in the folder."""
        sizes: dict[int, int] = {}
        for p in self.dir.glob("shard-*.*"):
            if p.name.endswith((".tokens.npy", ".meta.npz")):
                with contextlib.suppress(FileNotFoundError, ValueError):
                    k = int(p.name[6:11])
                    sizes[k] = sizes.get(k, 0) + p.stat().st_size
        out = []
        for k, size in sizes.items():
            try:
                used = self._stamp(k).stat().st_mtime
            except FileNotFoundError:
                used = 0.0
            out.append((k, size, used))
        return out

    def _evict(self, need: int, keep: int) -> None:
        """Delete the least recently used shards (not ``keep``, none another process is fetching) until ``need``
        more bytes fit in ``cache_bytes``."""
        shards = sorted(self._on_disk(), key=lambda x: x[2])
        total = sum(size for _k, size, _t in shards)
        for k, size, _t in shards:
            if total + need <= self.cache_bytes:
                break
            if k == keep:
                continue
            with self._locked(k, wait=False) as free:
                if not free:
                    continue
                for f in self.manifest.shards[k].files.both():
                    (self.dir / f.name).unlink(missing_ok=True)
                self._stamp(k).unlink(missing_ok=True)
                total -= size

    def _fetch(self, f: ShardFile) -> None:
        dest = self.dir / f.name
        if dest.exists() and dest.stat().st_size == f.bytes:
            return
        url = f"{self.remote}/{f.name}"
        name = self.fs.unstrip_protocol(url)  # s3://bucket/…, as the user wrote it
        try:
            with atomic_path(dest) as tmp:
                self._get(url, tmp, name)
                size = tmp.stat().st_size
                if size != f.bytes:
                    raise CorruptShardError(
                        f"{name}: {size} bytes, the manifest records {f.bytes} (truncated or rewritten)"
                    )
                digest = sha256_file(tmp)
                if digest != f.sha256:
                    raise CorruptShardError(
                        f"{name}: sha256 {digest}, the manifest records {f.sha256} (damaged shard file)"
                    )
        except OSError as e:
            if e.errno in _FULL:
                raise _disk_full(self.dir.parent, name, self.cache_bytes) from None
            raise
        if self.verifier is not None:
            self.verifier.trust(dest, f)  # just hashed

    def _get(self, url: str, tmp: Path, name: str) -> None:
        try:
            _retrying(lambda: self.fs.get(url, str(tmp)), name, self.outage_s)
        except FileNotFoundError:
            raise ShardError(f"{name}: not in the store, though manifest.json lists it; the build is damaged") from None

    def _unmap(self, k: int) -> None:
        """Drop this process's mapping of shard ``k`` (its files stay in the node's cache)."""
        self._mapped.pop(k)
        self._ready.discard(k)
        self._open.pop(k, None)


_T = TypeVar("_T")


def _disk_full(cache_dir: Path, name: str, cache_bytes: int) -> ShardError:
    return ShardError(
        f"{cache_dir}: the disk is full while caching {name} (cache_bytes {cache_bytes:,} of shards allowed): free "
        "space there, lower Reading(cache_bytes=...), or point Reading(cache_dir=...) at a larger disk"
    )


def _retrying(call: Callable[[], _T], name: str, outage_s: float) -> _T:
    """``call()``, retried through an outage of up to ``outage_s`` seconds (backoff 0.5 s, doubling to 8 s), then
    one :class:`ShardError` line naming ``name``. A missing object or a full disk is not an outage: raised as is."""
    deadline, wait = time.monotonic() + outage_s, 0.5
    while True:
        try:
            return call()
        except FileNotFoundError:
            raise
        except Exception as e:  # every backend's connection errors (botocore, aiohttp, OSError) look alike here
            if isinstance(e, OSError) and e.errno in _FULL:
                raise
            left = deadline - time.monotonic()
            if left <= 0:
                raise ShardError(
                    f"{name}: unreachable for {outage_s:g} s ({first_line(e)}); the store is down or the network "
                    "cut: resume from the last loader state when it is back, or wait longer with Reading(outage_s=...)"
                ) from None
            time.sleep(min(wait, left))
            wait = min(wait * 2, 8.0)


def open_remote(
    uri: str,
    cache_dir: Path,
    cache_bytes: int,
    storage_options: Mapping[str, Any] | None = None,
    verifier: Verifier | None = None,
    outage_s: float = OUTAGE_S,
) -> tuple[RemoteShardSet, bytes]:
    """The shards of the build at ``uri`` (a build folder or its ``shards`` folder) and the manifest's bytes.

    The cache is the node's folder ``cache_dir/<the manifest's sha256, 16 digits>``; ``verifier`` checks files
    found there before use (None: trusted by their size); ``outage_s``: see :class:`RemoteShardSet`.
    """
    fs, root = fsspec.core.url_to_fs(uri, **(storage_options or {}))
    root = root.rstrip("/")
    for base in (f"{root}/shards", root):
        if _retrying(lambda base=base: fs.exists(f"{base}/manifest.json"), uri, outage_s):  # type: ignore[misc]
            break
    else:
        raise ShardError(f"{uri}: no manifest.json here or under shards/; the build is missing or did not finish")
    manifest = _retrying(lambda: fs.cat_file(f"{base}/manifest.json"), uri, outage_s)
    digest = hashlib.sha256(manifest).hexdigest()
    local = cache_dir / digest[:16]
    try:
        local.mkdir(parents=True, exist_ok=True)
        if not (local / "manifest.json").is_file():
            with atomic_path(local / "manifest.json") as tmp:
                tmp.write_bytes(manifest)
    except OSError as e:
        if e.errno in _FULL:
            raise _disk_full(cache_dir, f"{uri}'s manifest.json", cache_bytes) from None
        raise
    return RemoteShardSet(local, fs, base, cache_bytes, verifier, outage_s), manifest
