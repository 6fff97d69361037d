"""A folder on a local disk or any fsspec filesystem (``s3://...``), with atomic, checksummed writes.

Local files are written under a temporary name beside the target and renamed (``layout.atomic_path``);
on object stores the object is uploaded under a temporary key (it appears whole or not at all) and moved.
Every write returns the file's size and sha256, computed while writing (no second read).
"""

from __future__ import annotations

import hashlib
import io
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import fsspec

from mixing.format.layout import atomic_path

__all__ = ["HashingWriter", "Store", "is_local", "sha256_file"]


def sha256_file(path: Path) -> str:
    """Hex sha256 of a local file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class HashingWriter(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to ``f``."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.h, self.n = f, hashlib.sha256(), 0

    def writable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        mv = memoryview(b).cast("B")
        self.h.update(mv)
        self.f.write(mv)
        self.n += len(mv)
        return len(mv)


def is_local(url: str) -> bool:
    """True for plain paths and ``file://`` URLs (memory-mappable, renamed atomically with os.replace)."""
    return "://" not in url or url.startswith("file://")


class Store:
    """A folder on a local disk or any fsspec filesystem, with atomic whole-file writes."""

    def __init__(self, url: str | Path, storage_options: dict[str, Any] | None = None) -> None:
        self.url = str(url).rstrip("/")
        self.local = is_local(self.url)
        self.path = Path(self.url.removeprefix("file://"))
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **(storage_options or {}))

    def key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def put(self, name: str, write: Callable[[BinaryIO], None]) -> dict[str, Any]:
        """Write ``name`` via ``write(stream)`` under a temporary name, rename it; return bytes and sha256."""
        if self.local:
            with atomic_path(self.path / name) as tmp, tmp.open("wb") as f:
                hw = HashingWriter(f)
                write(hw)  # type: ignore[arg-type]
        else:
            remote_tmp = self.key(f".{name}.{uuid.uuid4().hex}.tmp")
            with self.fs.open(remote_tmp, "wb") as f:
                hw = HashingWriter(f)
                write(hw)  # type: ignore[arg-type]
            self.fs.mv(remote_tmp, self.key(name))
        return {"name": name, "bytes": hw.n, "sha256": hw.h.hexdigest()}

    def names(self) -> list[str]:
        if self.local:
            return sorted(p.name for p in self.path.iterdir()) if self.path.is_dir() else []
        try:
            return sorted(p.rsplit("/", 1)[-1] for p in self.fs.ls(self.root, detail=False))
        except FileNotFoundError:
            return []

    def remove(self, name: str) -> None:
        if self.local:
            (self.path / name).unlink(missing_ok=True)
        elif self.fs.exists(self.key(name)):
            self.fs.rm(self.key(name))

    def read(self, name: str) -> bytes:
        if self.local:
            return (self.path / name).read_bytes()
        return self.fs.cat_file(self.key(name))

    def digest(self, name: str) -> tuple[int, str] | None:
        """(bytes, sha256) of ``name``, or None when it is missing."""
        if self.local:
            p = self.path / name
            return (p.stat().st_size, sha256_file(p)) if p.exists() else None
        if not self.fs.exists(self.key(name)):
            return None
        h, n = hashlib.sha256(), 0
        with self.fs.open(self.key(name), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
                n += len(block)
        return n, h.hexdigest()
