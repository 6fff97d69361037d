"""Shard files checked against the manifest's size and sha256 before any of their tokens reach the trainer.

A damaged shard (one flipped bit) would otherwise be served as plausible tokens, so
:class:`VerifiedShardSet` gates every way to a shard's data:

- sizes are checked when a shard is opened (a truncated or grown file fails before it is mapped);
- ``meta.npz`` (segments, steps, costs) is hashed before it is read (once per node: what a dataset reads of it
  is the node's index, :mod:`loaders.index`, made from verified meta files and itself checked the same way);
- ``tokens.npy`` is hashed in background threads a few shards ahead of the reader (hashlib and file reads
  release the GIL), and the first read of a shard's tokens waits for its verdict: a mismatch raises
  :class:`CorruptShardError` naming the file, with the sizes or digests expected and found.

Each file is hashed once per node, not once per process: a good verdict is kept as a marker in
``<cache_dir>/verified/`` keyed by the file's path, size, mtime, inode and expected sha256 (a file rewritten
since is hashed again), and a process that wants a file another one is hashing waits on the marker's lock
instead of hashing it twice (POSIX record locks: per process, so a forked worker never inherits one).
What a marker cannot see is damage that changes neither size nor mtime after the verdict (bit rot); a node
without the marker, or ``weir inspect``, hashes the file again.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from contract.manifest import ShardFile
from contract.shards import SequenceView, ShardError, ShardSet, sha256_file

__all__ = ["AHEAD", "CorruptShardError", "VerifiedShardSet", "Verifier", "verifier_for"]

AHEAD = 2  # shards whose tokens are hashed ahead of the one being read
_GOOD = b"ok\n"


class CorruptShardError(ShardError):
    """A shard file whose size or sha256 differs from what the manifest records (or that is missing)."""


def _identity(path: Path, f: ShardFile) -> tuple[str, int, int, int, str]:
    """What a verdict on ``path`` holds for; raises :class:`CorruptShardError` when its size is wrong."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CorruptShardError(f"{path}: missing; the manifest records {f.bytes} bytes") from None
    if st.st_size != f.bytes:
        raise CorruptShardError(
            f"{path}: {st.st_size} bytes, the manifest records {f.bytes} (truncated or rewritten shard file)"
        )
    return str(path), st.st_size, st.st_mtime_ns, st.st_ino, f.sha256


class Verifier:
    """Hashes shard files against their manifest entries (:class:`~contract.manifest.ShardFile`), in the
    background on ``threads`` threads, remembering good verdicts in this process and, when ``cache_dir`` is
    given and writable, on this node. Fork-safe: a child process drops the parent's pending jobs (their
    threads stay in the parent) and keeps only its finished good verdicts."""

    def __init__(self, cache_dir: str | Path | None, threads: int = 2) -> None:
        self.markers = Path(cache_dir) / "verified" if cache_dir is not None else None
        self.threads = threads
        self._good: set[tuple[str, int, int, int, str]] = set()
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: dict[str, Future[None]] = {}

    def __getstate__(self) -> dict[str, Any]:  # a spawned worker: no threads, jobs or locks travel
        return {"markers": self.markers, "threads": self.threads, "_good": set(self._good)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def check_size(self, path: Path, f: ShardFile) -> None:
        """Raise :class:`CorruptShardError` now if ``path`` is missing or its size is not the manifest's."""
        _identity(path, f)

    def trust(self, path: Path, f: ShardFile) -> None:
        """Record ``path`` as good (its caller has just hashed it, e.g. while fetching it)."""
        self._good.add(_identity(path, f))

    def vouch(self, path: Path, f: ShardFile) -> None:
        """:meth:`trust` ``path``, and keep the verdict for the node (its caller has just written and hashed it)."""
        key = _identity(path, f)
        marker = self._marker(key)
        if marker is not None:
            try:
                with open(marker, "wb") as m:
                    m.write(_GOOD)
            except OSError:  # a read-only cache: the verdict stays in this process
                pass
        self._good.add(key)

    def submit(self, path: Path, f: ShardFile) -> None:
        """Start verifying ``path`` in the background (once per path and process)."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            if str(path) not in self._jobs:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="weir-verify")
                self._jobs[str(path)] = self._pool.submit(self.verify, path, f)

    def wait(self, path: Path, f: ShardFile) -> None:
        """Return once ``path`` is verified, raise :class:`CorruptShardError` if it is not: its background job's
        verdict when one was submitted, else verified in the calling thread (it needs the file now anyway;
        no hand-off to a pool thread)."""
        if self._pid != os.getpid():
            self._reset()
        job = self._jobs.get(str(path))
        if job is None:
            self.verify(path, f)
        else:
            job.result()

    def verify(self, path: Path, f: ShardFile, records: str = "the manifest") -> None:
        """Verify ``path`` in the calling thread: this process's verdict, else the node's, else hash it
        (``records``: what holds ``f``, named in the error)."""
        key = _identity(path, f)
        if key in self._good:
            return
        marker = self._marker(key)
        if marker is None:
            self._hash(path, f, records)
        else:
            try:
                fd = os.open(marker, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:  # a read-only cache: verify in this process only
                fd = -1
            if fd < 0:
                self._hash(path, f, records)
            else:
                with os.fdopen(fd, "r+b") as m:
                    # flock, not lockf: POSIX record locks belong to the process, and the kernel reports
                    # EDEADLK between threads of one process hashing two files (seen in a worker)
                    fcntl.flock(m, fcntl.LOCK_EX)  # released on close; another process may be hashing it
                    if m.read() != _GOOD:
                        self._hash(path, f, records)
                        m.seek(0)
                        m.write(_GOOD)
        self._good.add(key)

    def _marker(self, key: tuple[str, int, int, int, str]) -> Path | None:
        if self.markers is None:
            return None
        try:
            self.markers.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        return self.markers / hashlib.sha256(repr(key).encode()).hexdigest()[:32]

    @staticmethod
    def _hash(path: Path, f: ShardFile, records: str = "the manifest") -> None:
        digest = sha256_file(path)
        if digest != f.sha256:
            what = "damaged shard file" if records == "the manifest" else "damaged file"
            raise CorruptShardError(f"{path}: sha256 {digest}, {records} records {f.sha256} ({what})")


class VerifiedShardSet(ShardSet):
    """A local :class:`~contract.shards.ShardSet` that yields no data of a file that fails its manifest entry
    (see the module docstring); ``verifier=None`` turns the checks off."""

    streamed = False  # shards fetched one at a time (loaders.remote), not one whole local build

    def __init__(self, shards_dir: Path | str, verifier: Verifier | None) -> None:
        super().__init__(shards_dir)
        self.verifier = verifier
        self._ready: set[int] = set()  # shards whose tokens are verified (checked once per shard)

    def _file(self, k: int, kind: str) -> tuple[Path, ShardFile]:
        f = getattr(self.manifest.shards[k].files, kind)
        return self.dir / f.name, f

    def _shard(self, k: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if self.verifier is not None and k not in self._open:
            self.verifier.check_size(*self._file(k, "tokens"))  # before np.load maps it
        return super()._shard(k)

    def shard_meta(self, k: int) -> dict[str, np.ndarray]:
        if self.verifier is not None:
            self.verifier.wait(*self._file(k, "meta"))
        return super().shard_meta(k)

    def tokens_ready(self, k: int) -> None:
        """Wait until shard ``k``'s tokens are verified, hashing the next :data:`AHEAD` shards meanwhile."""
        if k in self._ready or self.verifier is None:
            return
        self._shard(k)  # opens it: sizes and meta checked (and, when streamed, its files fetched)
        if not self.streamed:  # a remote shard's files are fetched (and hashed) when first read, not before
            for j in range(k + 1, min(len(self.manifest.shards), k + 1 + AHEAD)):
                self.verifier.submit(*self._file(j, "tokens"))
        self.verifier.wait(*self._file(k, "tokens"))
        self._ready.add(k)

    def shard_tokens(self, k: int) -> np.ndarray:
        self.tokens_ready(k)
        return super().shard_tokens(k)

    def verified_sequence(self, i: int) -> SequenceView:
        """:meth:`sequence` ``i`` once its shard's tokens are verified (:meth:`sequence` itself serves
        metadata readers such as the planner, which must not wait for token hashes)."""
        if self.verifier is not None and 0 <= i < len(self):
            self.tokens_ready(int(np.searchsorted(self._starts, i, side="right") - 1))
        return self.sequence(i)


def verifier_for(verify: bool, cache_dir: Path) -> Verifier | None:
    """The verifier a dataset uses: None when ``verify`` is False; markers under ``cache_dir``."""
    return Verifier(cache_dir) if verify else None
