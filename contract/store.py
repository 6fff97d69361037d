"""The one storage layer of a build root: a local folder or any fsspec URL (``s3://bucket/prefix``).

Writes are whole-file and checksummed: every write returns the file's size and sha256, computed while
writing (no second read). Local files are written under a temporary name beside the target and renamed
(:func:`contract.atomic.atomic_path`). On object stores (s3, gcs, azure) an object appears whole when its upload
completes, so it is written straight to its key, and a write that fails aborts its upload (the key keeps what it
had): there is no rename there, and what makes a set of objects trustworthy is the record written after them (a
stage's commit record, :mod:`mixing.output.commit`; the shards' manifest). Other fsspec filesystems (memory://
included: its files are visible from their open) get a temporary name and a move, as local files do. Remote
listings are not cached: other processes write into the same root.

:meth:`Store.open` is the checked way in: a URL whose protocol fsspec does not know, or a root it cannot
reach (no such bucket, no endpoint, refused credentials), is one :class:`StoreError` line that names the
root without its credentials (:mod:`contract.redaction`), never a local folder with a strange name.

A root shared by builds on several machines can be fenced (:func:`contract.fence.fenced`): every write and
removal under it is admitted by its fence first; an upload just before it completes, so a refused one leaves
nothing behind. Ranged reads of a remote file coalesce close ranges into few requests (:mod:`contract.ranges`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import shutil
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import fsspec

from contract.atomic import atomic_path
from contract.errors import WeirError
from contract.fence import Fence, covering
from contract.ranges import coalesce
from contract.redaction import has_user_info, redact_url, scrub, secrets_of

__all__ = ["HashingWriter", "Store", "StoreError", "is_local", "sha256_file"]

# An object on these is visible only once its upload completes (a memory:// file is visible from its open, so it
# is not one of them).
_WHOLE_ON_UPLOAD = {"s3", "s3a", "gs", "gcs", "abfs", "az"}


class StoreError(WeirError):
    """A build root that cannot be used: unknown protocol, unreachable, or refused."""


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
    """A folder on a local disk or any fsspec filesystem: whole-file checksummed writes, reads, listings.

    Names are ``/``-separated paths relative to the folder (``sources/web/chunks/<key>/tokens.bin``).
    """

    def __init__(self, url: str | Path, storage_options: dict[str, Any] | None = None) -> None:
        self.url = str(url).rstrip("/")
        self.local = is_local(self.url)
        self.path = Path(self.url.removeprefix("file://"))
        self.storage_options = dict(storage_options or {})
        # No listings cache: other processes (a cluster's workers) write into the same root, and a stale listing
        # would hide their files from names() and exists().
        options = self.storage_options if self.local else {"use_listings_cache": False, **self.storage_options}
        self.fs, self.root = fsspec.core.url_to_fs(self.url, **options)
        protocol = self.fs.protocol
        self.protocol = protocol[0] if isinstance(protocol, tuple | list) else str(protocol)

    @classmethod
    def open(cls, url: str | Path, storage_options: dict[str, Any] | None = None) -> Store:
        """A store at ``url`` that is known reachable: a local folder (created), or a remote root whose bucket
        answers a listing (within seconds on s3). Raises :class:`StoreError` (one line that names the root, no
        credentials) otherwise: unknown protocol, credentials in a URL its filesystem does not read, no bucket,
        refused credentials, unreachable endpoint."""
        hidden = secrets_of(str(url), storage_options or {})

        def refuse(why: str) -> StoreError:
            return StoreError(scrub(f"build root {redact_url(str(url))}: {why}", hidden))

        if not is_local(str(url)):
            protocol = str(url).split("://", 1)[0]
            try:
                fsspec.get_filesystem_class(protocol)
            except (ValueError, ImportError) as e:
                raise refuse(f"no fsspec filesystem for {protocol}:// ({_one_line(e)})") from None
        try:
            store = cls(url, storage_options)
        except Exception as e:  # a filesystem's constructor refusing its options
            raise refuse(f"{type(e).__name__}: {_one_line(e)}") from None
        if store.local:
            try:
                store.path.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise refuse(f"cannot create it ({e.strerror})") from None
            return store
        if has_user_info(str(url)) and "@" in store.root:  # the filesystem took them for part of the path
            raise refuse(f"{store.protocol}:// does not read credentials from the URL; give them in storage_options")
        bucket = store.root.split("/", 1)[0]
        try:
            probe = store.fs
            if store.protocol == "s3":  # answer in seconds, not after botocore's minutes of retries and timeouts
                # (the caller's own config_kwargs win; the store itself keeps the caller's options; a fresh dict
                # each time, as botocore rewrites "retries" in place)
                probing = {"connect_timeout": 5, "read_timeout": 10, "retries": {"total_max_attempts": 2}}
                opts = {**store.storage_options, "skip_instance_cache": True}
                opts["config_kwargs"] = {**probing, **opts.get("config_kwargs", {})}
                probe = fsspec.core.url_to_fs(store.url, **opts)[0]
            probe.ls(bucket, detail=False)
        except FileNotFoundError:
            raise refuse(f"no bucket {bucket!r} at this endpoint; create it first") from None
        except PermissionError as e:
            raise refuse(f"access refused ({_one_line(e)})") from None
        except Exception as e:  # no endpoint, a timeout: botocore's and aiohttp's own types
            raise refuse(f"unreachable ({type(e).__name__}: {_one_line(e)})") from None
        return store

    def key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def fence(self) -> Fence | None:
        """The fence of the root this folder is in (:func:`contract.fence.fenced`), if any."""
        found = self._fenced(self.root)
        return found[0] if found else None

    def _fenced(self, path: str) -> tuple[Fence, str] | None:
        """The fence covering ``path`` (a key of this filesystem) and ``path`` relative to its root."""
        return None if self.local else covering(self.protocol, path)

    def _admit(self, name: str) -> None:
        """Ask the fence covering ``name``, if any, whether it may be written or removed now (it raises if not)."""
        found = self._fenced(self.key(name).rstrip("/"))
        if found is not None:
            found[0].admit(found[1])

    def sub(self, name: str) -> Store:
        """The folder ``name`` inside this one, on the same filesystem and options."""
        return Store(f"{self.url}/{name}", self.storage_options)

    def put(self, name: str, write: Callable[[BinaryIO], None] | bytes) -> dict[str, Any]:
        """Write ``name`` whole (``write(stream)``, or the bytes given); return ``{name, bytes, sha256}``.

        Whole or not at all: when ``write`` raises, ``name`` keeps what it had (nothing, or the previous file)
        and no temporary file or pending upload is left behind."""
        fill = _writer(write)
        if self.local:
            with atomic_path(self.path / name) as tmp, tmp.open("wb") as f:
                hw = HashingWriter(f)
                fill(hw)  # type: ignore[arg-type]
        elif self.protocol in _WHOLE_ON_UPLOAD:
            f = self.fs.open(self.key(name), "wb")
            try:
                hw = HashingWriter(f)
                fill(hw)  # type: ignore[arg-type]
                self._admit(name)  # as late as can be: the object appears only when the upload completes
                f.close()  # completes the upload: the object appears, whole
            except BaseException:
                f.discard()  # abort the upload (closing the file would complete it with what was written)
                f.closed = True
                raise
        else:
            parent, _, base = name.rpartition("/")
            remote_tmp = self.key(f"{parent + '/' if parent else ''}.{base}.{uuid.uuid4().hex}.tmp")
            try:
                with self.fs.open(remote_tmp, "wb") as f:
                    hw = HashingWriter(f)
                    fill(hw)  # type: ignore[arg-type]
                self._admit(name)
                self.fs.mv(remote_tmp, self.key(name))
            except BaseException:
                with contextlib.suppress(OSError):
                    self.fs.rm(remote_tmp)
                raise
        return {"name": name, "bytes": hw.n, "sha256": hw.h.hexdigest()}

    def put_file(self, name: str, local: Path) -> dict[str, Any]:
        """Copy the local file ``local`` to ``name`` (as :meth:`put`)."""
        with local.open("rb") as src:
            return self.put(name, lambda f: _copy(src, f))

    def get_file(self, name: str, local: Path) -> None:
        """Copy ``name`` to the local path ``local`` (written under a temporary name and renamed)."""
        with atomic_path(local) as tmp:
            if self.local:
                tmp.write_bytes((self.path / name).read_bytes())
            else:
                self.fs.get_file(self.key(name), str(tmp))

    def names(self, folder: str = "") -> list[str]:
        """The entries (files and folders) directly in ``folder`` (default: this one), sorted; [] if missing."""
        if self.local:
            p = self.path / folder
            return sorted(x.name for x in p.iterdir()) if p.is_dir() else []
        path = self.key(folder) if folder else self.root
        try:
            listed = [x.rstrip("/") for x in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []
        return sorted(x.rsplit("/", 1)[-1] for x in listed if x != path)  # ls of a file lists the file itself

    def walk(self, folder: str) -> list[str]:
        """Every file under ``folder``, as paths relative to it (sorted); [] if missing. One listing, even remote."""
        if self.local:
            base = self.path / folder
            return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()) if base.is_dir() else []
        prefix = self.key(folder).rstrip("/") + "/"
        try:
            found = self.fs.find(prefix)
        except FileNotFoundError:
            return []
        return sorted(p.removeprefix(prefix) for p in found if p.startswith(prefix))

    def exists(self, name: str) -> bool:
        return (self.path / name).exists() if self.local else bool(self.fs.exists(self.key(name)))

    def remove(self, name: str) -> None:
        if self.local:
            (self.path / name).unlink(missing_ok=True)
        elif self.fs.exists(self.key(name)):
            self._admit(name)
            self.fs.rm(self.key(name))

    def remove_tree(self, folder: str) -> None:
        """Remove ``folder`` and everything under it (nothing if missing)."""
        if self.local:
            shutil.rmtree(self.path / folder, ignore_errors=True)
        else:
            self._admit(folder)
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(self.key(folder), recursive=True)

    def read(self, name: str) -> bytes:
        if self.local:
            return (self.path / name).read_bytes()
        return self.fs.cat_file(self.key(name))  # type: ignore[no-any-return]

    def read_ranges(self, name: str, starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        """Bytes ``[starts[i], ends[i])`` of ``name``, one ``bytes`` each (empty where ``ends[i] <= starts[i]``);
        remote ranges are fetched concurrently, those less than :data:`contract.ranges.GAP` apart as one request
        (a shard gathers thousands of short documents from a chunk: one request each would cost a round trip each).
        Raises the first error (a missing file: FileNotFoundError)."""
        ranges = list(zip(starts, ends, strict=True))
        if self.local:
            with (self.path / name).open("rb") as f:
                out = []
                for s, e in ranges:
                    f.seek(s)
                    out.append(f.read(max(0, e - s)))
                return out
        requests = coalesce(ranges)
        got = self.fs.cat_ranges(
            [self.key(name)] * len(requests.blocks),
            [b[0] for b in requests.blocks],
            [b[1] for b in requests.blocks],
            on_error="raise",  # fsspec's default returns the exceptions in the list, as if they were bytes
        )
        return requests.cut(got)

    def size(self, name: str) -> int | None:
        """Bytes of ``name``, or None when it is missing (one stat or HEAD request, no read)."""
        if self.local:
            p = self.path / name
            return p.stat().st_size if p.is_file() else None
        try:
            return int(self.fs.size(self.key(name)))
        except FileNotFoundError:
            return None

    def digest(self, name: str) -> tuple[int, str] | None:
        """(bytes, sha256) of ``name``, or None when it is missing."""
        if self.local:
            p = self.path / name
            return (p.stat().st_size, sha256_file(p)) if p.exists() else None
        h, n = hashlib.sha256(), 0
        try:
            f = self.fs.open(self.key(name), "rb")
        except FileNotFoundError:
            return None
        with f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
                n += len(block)
        return n, h.hexdigest()


def _writer(write: Callable[[BinaryIO], None] | bytes) -> Callable[[BinaryIO], None]:
    if not isinstance(write, bytes):
        return write
    data = write

    def fill(f: BinaryIO) -> None:
        f.write(data)

    return fill


def _copy(src: BinaryIO, dst: BinaryIO) -> None:
    while block := src.read(1 << 22):
        dst.write(block)


def _one_line(e: BaseException) -> str:
    """``e``'s message on one line (botocore's run over several), at most 300 characters."""
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    return text[:300] if text else type(e).__name__
