"""Source index: the files a source's URI matches, each with a fingerprint, and reading their records.

Two identities of an indexed file: its ``fingerprint`` (size + mtime or ETag, from the listing alone: where a
file is and when it was written) and its content digest (:func:`file_digest`: what it holds, wherever it is),
which the chunk cache uses to find a file's tokens again after the file moved or was copied elsewhere.

Reading a file the index listed (:class:`Listed`, :func:`read_ahead`) checks that it is still the file the index
describes, as it is opened and after its last record: its size, and a local file's fingerprint (size + mtime,
from ``fstat`` of the open file) or an object's size + ETag. A file written since it was listed raises
:class:`FileChangedError` naming it, so that the tokens never hold other bytes than the index describes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import posixpath
import queue
import re
import stat
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import polars as pl

from contract.errors import WeirError
from mixing.ingest.filenames import real_path, shown_path
from mixing.ingest.formats import is_code_file, read_file
from mixing.ingest.records import Record, bad
from mixing.mixfile import envvars
from mixing.mixfile.mix import Mix, SourceSpec

__all__ = [
    "INDEX_SCHEMA",
    "FileChangedError",
    "Listed",
    "Record",
    "SourceIndexError",
    "file_digest",
    "file_name",
    "index_source",
    "read_ahead",
    "read_records",
    "skipped_record",
]

INDEX_SCHEMA = {
    "path": pl.String,
    "size": pl.Int64,
    "fingerprint": pl.String,
    "skipped": pl.String,
    "name": pl.String,
    "content": pl.String,
}


class SourceIndexError(WeirError, RuntimeError):
    """A source whose URI matches no file, or whose storage cannot be listed."""


class FileChangedError(SourceIndexError):
    """A file read for the documents that is not the one the source index listed: written since (another size,
    mtime or ETag). Nothing read from it is kept; building again indexes it anew."""


@dataclass(frozen=True)
class Listed:
    """A file to read as the source index listed it: its shown ``path``, and what reading it must find again
    (``size`` in bytes, ``fingerprint``, ``content``; each None when the index has none, which checks nothing)."""

    path: str
    size: int | None = None
    fingerprint: str | None = None
    content: str | None = None

    @staticmethod
    def of(row: Mapping[str, Any]) -> Listed:
        """An index row (:data:`INDEX_SCHEMA`'s columns) as a file to read: checked when it has a ``size`` and a
        ``fingerprint`` of :func:`index_source`'s making (16 hex digits), as every row of an index has; a row
        made otherwise (a path alone, a key of its own) is read unchecked."""
        fp = row.get("fingerprint")
        if row.get("size") is None or not isinstance(fp, str) or not _FINGERPRINT.fullmatch(fp):
            return Listed(str(row["path"]))
        return Listed(str(row["path"]), int(row["size"]), str(row["fingerprint"]), row.get("content"))

    def check(self, raw: Any) -> None:
        """Raise :class:`FileChangedError` when ``raw`` (this file, open: a local file, or an fsspec file whose
        ``details`` are its object's listing) is not what the index listed. Cheap: one ``fstat`` of a local
        file (its fingerprint), the open object's size and ETag otherwise (nothing is hashed). What cannot be
        compared (no descriptor nor details, an object listed without size or ETag) passes."""
        if self.fingerprint is None:
            return
        try:
            st = os.fstat(raw.fileno())
        except (AttributeError, OSError, ValueError):  # not a local file (io.UnsupportedOperation is both)
            st = None
        if st is not None:
            if _stat_fingerprint(st) != self.fingerprint:
                self._changed(st.st_size)
            return
        details = getattr(raw, "details", None)
        if not isinstance(details, Mapping) or details.get("size") is None:
            return
        size, etag = int(details["size"]), details.get("ETag")
        if (self.size and size != self.size) or (etag and self.content and _etag_content(size, etag) != self.content):
            self._changed(size)

    def _changed(self, size: int) -> None:
        what = "the same size, written since" if size == self.size else f"{self.size} bytes listed, {size} now"
        raise FileChangedError(
            envvars.redact(
                f"{self.path}: changed since the source index listed it ({what}); nothing read from it is kept: "
                "build again once it is written (the build indexes it anew)"
            )
        )


def index_source(mix: Mix, name: str, storage_options: dict[str, Any] | None = None) -> pl.DataFrame:
    """List the files of source ``name`` with a fingerprint each.

    Returns the columns of :data:`INDEX_SCHEMA`: ``path`` (full URI, sorted), ``size`` (bytes),
    ``fingerprint`` (hex of size + mtime or etag: a file rewritten with other bytes gets another one),
    ``name`` (the path below the URI's fixed folder: the part before its first glob, a single file's folder,
    a ``code`` folder; the same wherever that folder is moved, copied or linked), ``content`` (a digest of
    the contents the listing gives for free: size + ETag of an object store's object; null for a local
    file, which :func:`file_digest` hashes when asked) and ``skipped``: null for a file to read,
    else why the matched path is not read (``"dangling symlink: ..."``, ``"symlink loop: ..."``, ``"is a
    directory: ..."``, ``"not a regular file: ..."``; a reason of :data:`mixing.ingest.records.REASONS` and its
    detail), so that every path the URI matched is accounted for (the documents stage quarantines skipped
    ones). A local name that is not UTF-8 is listed escaped (:func:`mixing.ingest.filenames.shown_path`, e.g.
    ``caf\\xe9.txt``) and read like any other; it is quarantined (``unreadable file``) only should another file
    bear that escaped name. A symlink to a file is read (fingerprinted by its target). A ``code`` source's URI
    may name a folder (every file below it with a known extension, and ``.tar`` archives); folders a ``**``
    glob walks through are not listed. ``storage_options`` go to fsspec (for ``s3://``: endpoint and
    credentials from the Dagster resource, never from the mix file). Deterministic for unchanged
    storage. Raises :class:`SourceIndexError` when no file to read matches.
    """
    uri = mix.source_uri(name)
    spec = mix.sources[name]
    try:
        fs, pattern = fsspec.core.url_to_fs(uri, **(storage_options or {}))
        if spec.format == "code" and not _is_glob(pattern) and fs.isdir(pattern):
            pattern = pattern.rstrip("/") + "/**"
        infos = fs.glob(pattern, detail=True) if _is_glob(pattern) else _single(fs, pattern)
    except (OSError, ValueError) as e:
        raise SourceIndexError(f"source {name!r}: cannot list {uri!r}: {type(e).__name__}: {e}") from None
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    local = protocol in ("file", "local")
    walked = pattern.rstrip("/").endswith("**")  # folders a ** glob walks through are not "matches"
    base = _fixed_folder(pattern)
    rows: list[dict[str, Any]] = []
    for p, listed in sorted(infos.items()):
        if spec.format == "code" and not is_code_file(p, spec):
            continue
        info, skipped = _classify(p, listed, local)
        if skipped is None and info.get("type") == "directory" and walked and not listed.get("islink"):
            continue
        if skipped is None and info.get("type") != "file":
            kind = info.get("type")
            skipped = "is a directory: it matches the glob" if kind == "directory" else f"not a regular file: {kind}"
        full = shown_path(p) if local else f"{protocol}://{p}"  # a name that is not UTF-8 is shown escaped
        if skipped is None and full != p and os.path.lexists(full):
            skipped = "unreadable file: its name is not UTF-8, and its escaped form names another file"
        stamp = info.get("ETag") or info.get("mtime") or info.get("LastModified") or ""
        fp = _fingerprint(skipped or f"{info.get('size')}|{stamp}")
        size = 0 if skipped else int(info.get("size") or 0)
        name = p[len(base) + 1 :] if base and p.startswith(base + "/") else p
        etag = None if local or skipped else info.get("ETag")
        content = _etag_content(size, etag) if etag else None
        rows.append(
            {
                "path": full,
                "size": size,
                "fingerprint": fp,
                "skipped": skipped,
                "name": shown_path(name) if local else name,
                "content": content,
            }
        )
    if not any(r["skipped"] is None for r in rows):
        why = "; ".join(f"{r['path']}: {r['skipped']}" for r in rows[:3])
        why = f" (skipped: {why})" if why else ""
        raise SourceIndexError(
            f"source {name!r}: no file matches {uri!r}{why}; expected at least one "
            "(for the demo mix, run `weir demo-data` first)"
        )
    return pl.DataFrame(rows, schema=INDEX_SCHEMA)


def _fixed_folder(pattern: str) -> str:
    """The folder of ``pattern`` (an fsspec path) that holds no glob: the parts before the first that has one,
    or the folder of a single path. Matched paths are named below it, so that moving, copying or linking that
    folder elsewhere keeps every file's name."""
    parts = pattern.rstrip("/").split("/")
    fixed = next((i for i, part in enumerate(parts) if _is_glob(part)), None)
    return "/".join(parts[:fixed]) if fixed is not None else posixpath.dirname(pattern.rstrip("/"))


def file_name(row: Mapping[str, Any]) -> str:
    """An index row's ``name`` (its path below the source's fixed folder), or its ``path`` when the index has no
    names (an index made by hand, or by a version of weir before names)."""
    return str(row.get("name") or row["path"])


def file_digest(row: Mapping[str, Any], env: Mapping[str, str] | None = None) -> str | None:
    """The content digest of an index row: equal digests, equal bytes, wherever the files are.

    A local file's sha256 (reading it whole: a pass at disk speed, far cheaper than tokenizing it), an object's
    ``content`` from its listing (size + ETag), a skipped path's reason. None when it cannot be known
    without downloading the object (a listing without ETag), when the file cannot be read, when the row has no
    ``fingerprint`` (a file the index could not identify is never reused, whatever it holds), or when a local
    file's size or mtime is not what the row lists, before or after the hashing: a file written since it was
    listed may have been read (tokenized) before or after, so its digest could describe other bytes than its
    chunk's; without one its chunk is never found by content, only tokenized again. ``env``: as for
    :func:`mixing.mixfile.envvars.expand`.
    """
    if not row.get("fingerprint"):
        return None
    if row.get("skipped"):
        return hashlib.sha256(f"skipped|{row['skipped']}".encode()).hexdigest()[:32]
    if row.get("content"):
        return str(row["content"])
    path = str(row["path"])
    if "://" in path:
        return None
    h = hashlib.sha256()
    try:
        with open(real_path(envvars.expand(path, env)), "rb") as f:
            if _stat_fingerprint(os.fstat(f.fileno())) != row["fingerprint"]:
                return None
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
            if _stat_fingerprint(os.fstat(f.fileno())) != row["fingerprint"]:
                return None
    except OSError:  # unreadable (or an {env_NAME} not set): tokenizing it will say why
        return None
    return h.hexdigest()[:32]


_FINGERPRINT = re.compile(r"[0-9a-f]{16}")  # what _fingerprint gives


def _etag_content(size: int, etag: str) -> str:
    """An object's ``content`` in the index: its digest by size + ETag (equal for equal bytes in a store)."""
    return hashlib.sha256(f"etag|{size}|{etag}".encode()).hexdigest()[:32]


def _fingerprint(text: str) -> str:
    """A file's fingerprint in the index from its ``size|stamp`` (or why it is skipped)."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _stat_fingerprint(st: os.stat_result) -> str:
    """The fingerprint :func:`index_source` gives a local file of this stat (fsspec's ``mtime`` is ``st_mtime``)."""
    return _fingerprint(f"{st.st_size}|{st.st_mtime or ''}")


def _classify(path: str, info: dict[str, Any], local: bool) -> tuple[dict[str, Any], str | None]:
    """A listed path's info (a local symlink's target's) and why it is skipped, or None to read it."""
    if not (local and info.get("islink")):
        return info, None
    try:
        st = os.stat(path)  # follows the link
    except OSError as e:
        if e.errno == errno.ELOOP:
            return info, f"symlink loop: it points to {info.get('destination')!r}, which never reaches a file"
        return info, f"dangling symlink: it points to {info.get('destination')!r} ({e.strerror})"
    if stat.S_ISDIR(st.st_mode):
        return info, "is a directory: a symlink to a folder (not followed)"
    kind = "file" if stat.S_ISREG(st.st_mode) else "other"
    return {**info, "type": kind, "size": st.st_size, "mtime": st.st_mtime}, None


def _single(fs: Any, path: str) -> dict[str, dict[str, Any]]:
    return {path: fs.info(path)} if fs.exists(path) else {}


def _is_glob(pattern: str) -> bool:
    return any(c in pattern for c in "*?[")


def read_records(
    path: str | Listed,
    spec: SourceSpec,
    storage_options: dict[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[Record]:
    """Yield the records of one file in order; malformed ones carry ``error`` instead of ``text``.

    Streams (memory bounded by ``spec.batch_rows`` / ``spec.max_record_bytes``); see :mod:`mixing.ingest.formats`.
    A :class:`Listed` file is checked against its listing as it is opened and after its last record (raises
    :class:`FileChangedError`). ``env``: the lister's ``{env_NAME}`` values (:func:`mixing.mixfile.envvars.shipped`).
    """
    if isinstance(path, Listed):
        check: Callable[[Any], None] | None = path.check if path.fingerprint else None
        return read_file(path.path, spec, storage_options, env=env, check=check)
    return read_file(path, spec, storage_options, env=env)


_AHEAD_BYTES = 256 << 10  # text per hand-over from the reader thread (four are queued at most)
_DONE = object()


def read_ahead(
    groups: Sequence[Sequence[str | Listed | Record]],
    spec: SourceSpec,
    storage_options: dict[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
) -> Iterator[tuple[int, Record | None]]:
    """``(group index, record)`` for every record of every group's files in order; ``(index, None)`` after
    each file. An item that is a :class:`Record` already (a skipped path's) is passed on as the file's
    only record; a :class:`Listed` file is checked against its listing (:func:`read_records`).

    Reading and parsing run in a background thread, a few small batches ahead (bounded queue), so they
    overlap tokenizing, which releases the GIL. Errors in the reader are raised here.
    """
    q: queue.Queue[Any] = queue.Queue(maxsize=4)
    stop = threading.Event()

    def produce() -> None:
        try:
            buf: list[tuple[int, Record | None]] = []
            size = 0
            for gi, group in enumerate(groups):
                for path in group:
                    recs = [path] if isinstance(path, Record) else read_records(path, spec, storage_options, env)
                    for rec in recs:
                        buf.append((gi, rec))
                        size += len(rec.text or "")
                        if size >= _AHEAD_BYTES or len(buf) >= 4096:
                            q.put(buf)
                            buf, size = [], 0
                            if stop.is_set():
                                return
                    buf.append((gi, None))
            q.put(buf)
            q.put(_DONE)
        except BaseException as e:  # handed to the consumer, which raises it
            q.put(e)

    t = threading.Thread(target=produce, name="weir-read-ahead", daemon=True)
    t.start()
    try:
        while (item := q.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield from item
    finally:
        stop.set()
        while t.is_alive():  # unblock a producer waiting on a full queue
            with contextlib.suppress(queue.Empty):
                q.get(timeout=0.05)
        t.join()


def skipped_record(path: str, skipped: str) -> Record:
    """The quarantined record that accounts for a path :func:`index_source` skipped (``reason: detail``)."""
    reason, detail = skipped.split(": ", 1)
    return bad(path, 0, reason, detail)
