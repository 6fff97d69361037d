"""One build at a time per object-store root: a lease object taken and renewed with conditional writes.

A local output is guarded by an ``flock`` (:func:`pipelines.transaction.output_lock`), which the kernel
releases when its holder dies. Two drivers on two machines building into one ``s3://`` root share no kernel:
the root holds the lease instead, the object :data:`LEASE_NAME`, JSON naming its holder (host, pid, start)
and its ``ttl``. It is created only if absent (``If-None-Match: *``), renewed every ``ttl / 4`` seconds and
released only by its holder (``If-Match`` its last ETag), so two drivers never both hold it. A holder killed
with ``kill -9`` stops renewing: once the object is older than its ``ttl`` by the server's own clock (its
``Last-Modified`` against the ``Date`` of the answer, so the machines' clocks do not matter), the next build
takes it over, again with ``If-Match``, so of two drivers taking over one stale lease exactly one succeeds.

A holder that cannot renew in time (a driver stalled past ``ttl``, a network cut) may lose the lease to
another build; it notices at its next renewal and :meth:`Lease.check` (called when the build ends) raises
:class:`LeaseLost`. What the two builds wrote is still never trusted unchecked: every stage's commit record and
the shards' manifest list checksums.

``ttl`` is :data:`DEFAULT_TTL` seconds, or ``WEIR_LEASE_TTL``. Only ``s3://`` roots (and S3-compatible
endpoints) have these conditional writes; another remote protocol builds without a lease, saying so.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

from contract.errors import WeirError
from contract.store import Store

__all__ = ["DEFAULT_TTL", "LEASE_NAME", "TTL_ENV", "BuildBusy", "Lease", "LeaseLost", "root_lease"]

LEASE_NAME = ".weir-build.lease"
DEFAULT_TTL = 60.0
TTL_ENV = "WEIR_LEASE_TTL"


class BuildBusy(WeirError):
    """Another ``weir build`` is building into the same output: it holds a local output's lock
    (:func:`pipelines.transaction.output_lock`) or renews an object-store root's lease."""


class LeaseLost(WeirError):
    """This build's lease was taken over while it ran (it could not renew it within its ttl)."""


class Lease:
    """The lease of one root, held by this process: renewed by a daemon thread until :meth:`release`."""

    def __init__(self, store: Store, etag: str, body: dict[str, Any]) -> None:
        self._store, self._etag, self._body = store, etag, body
        self._lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="weir-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        beat = 0
        while not self._stop.wait(self._body["ttl"] / 4):
            beat += 1
            try:
                self._etag = _put(self._store, {**self._body, "beat": beat}, if_match=self._etag)
            except _Refused:
                now = _head(self._store)
                self._lost = f"now held by {now[1].get('holder', 'unknown')}" if now else "its object was removed"
                return
            except OSError:  # a transient failure: the next beat tries again, well within the ttl
                continue

    def check(self) -> None:
        """Raise :class:`LeaseLost` if another build took the lease over while this one held it."""
        if self._lost:
            raise LeaseLost(
                f"{self._store.url}: this build lost its lease ({self._lost}); it could not renew it within "
                f"{self._body['ttl']:g} s, so another build may have written into the root meanwhile: build again"
            )

    def release(self) -> None:
        """Stop renewing and remove the lease object, if it is still this build's. A removal that fails (the
        store unreachable) leaves the lease to expire after its ttl: the next build takes it over, saying so."""
        self._stop.set()
        self._thread.join()
        if not self._lost:
            with contextlib.suppress(OSError):
                _delete(self._store, self._etag)


@contextmanager
def root_lease(
    store: Store, wait: bool, say: Callable[[str], None], ttl: float | None = None
) -> Iterator[Lease | None]:
    """Hold the lease of the remote root ``store`` for the ``with`` block (``None`` where the protocol has no
    conditional writes, said once). Raises :class:`BuildBusy` naming the holder when another driver holds it
    and ``wait`` is false; with ``wait``, polls until it is released or expires. Raises :class:`LeaseLost` on
    exit if the lease was taken over meanwhile."""
    if store.protocol not in ("s3", "s3a"):  # fsspec has no conditional writes for the others
        say(f"{store.url}: {store.protocol}:// has no conditional writes: nothing keeps another build out of this root")
        yield None
        return
    lease = _acquire(store, wait, say, _ttl() if ttl is None else ttl)
    try:
        yield lease
    finally:
        lease.release()
    lease.check()


def _ttl() -> float:
    raw = os.environ.get(TTL_ENV, "").strip()
    if not raw:
        return DEFAULT_TTL
    try:
        ttl = float(raw)
    except ValueError:
        ttl = 0.0
    if not 1 <= ttl <= 86400:
        raise WeirError(f"{TTL_ENV}={raw!r}: expected seconds between 1 and 86400")
    return ttl


def _acquire(store: Store, wait: bool, say: Callable[[str], None], ttl: float) -> Lease:
    host = socket.gethostname()
    started = datetime.now(UTC).isoformat(timespec="seconds")
    body: dict[str, Any] = {"holder": f"{host} pid {os.getpid()}", "started": started, "ttl": ttl, "beat": 0}
    waiting = False
    while True:
        try:
            return Lease(store, _put(store, body, if_match=None), body)
        except _Refused:
            pass
        now = _head(store)
        if now is None:
            continue  # released between the two requests
        etag, held, age = now
        declared = held.get("ttl")
        their_ttl = float(declared) if isinstance(declared, int | float) else DEFAULT_TTL  # damaged: the default
        if age >= their_ttl:
            try:
                lease = Lease(store, _put(store, body, if_match=etag), body)
            except _Refused:
                continue  # another driver took it over first, or its holder renewed it just now
            say(f"took over the lease of {store.url} from {held.get('holder', 'unknown')}: not renewed for {age:.0f} s")
            return lease
        holder = f"{held.get('holder', 'unknown')} (since {held.get('started', '?')}, renewed {age:.0f} s ago)"
        if not wait:
            raise BuildBusy(
                f"{store.url}: another weir build holds this root's lease: {holder}; wait for it, or pass --wait "
                f"to start when it is done (a killed build's lease expires {their_ttl - age:.0f} s from now)"
            )
        if not waiting:
            say(f"waiting for the build of {holder} into {store.url} to finish")
            waiting = True
        time.sleep(min(2.0, their_ttl / 4))


class _Refused(Exception):
    """A conditional write whose condition did not hold."""


def _bucket_key(store: Store) -> tuple[str, str]:
    bucket, _, prefix = store.root.partition("/")
    return bucket, f"{prefix}/{LEASE_NAME}" if prefix else LEASE_NAME


def _put(store: Store, body: dict[str, Any], if_match: str | None) -> str:
    """Write the lease if absent (``if_match`` None) or if its ETag is ``if_match``; its new ETag."""
    bucket, key = _bucket_key(store)
    condition = {"IfNoneMatch": "*"} if if_match is None else {"IfMatch": if_match}
    try:
        out = store.fs.call_s3("put_object", Bucket=bucket, Key=key, Body=json.dumps(body).encode(), **condition)
    except OSError as e:
        if _precondition(e):
            raise _Refused from None
        raise
    return str(out["ETag"])


def _head(store: Store) -> tuple[str, dict[str, Any], float] | None:
    """The lease's (ETag, body, age in seconds by the server's clock), or None when there is none."""
    bucket, key = _bucket_key(store)
    try:
        out = store.fs.call_s3("head_object", Bucket=bucket, Key=key)
        data = store.fs.cat_file(store.key(LEASE_NAME))  # only for the holder's name and ttl: the ETag decides
    except FileNotFoundError:
        return None
    try:
        held = json.loads(data)
    except ValueError:
        held = None
    date = out["ResponseMetadata"]["HTTPHeaders"].get("date")
    server_now = parsedate_to_datetime(date) if date else datetime.now(UTC)
    age = max(0.0, (server_now - out["LastModified"]).total_seconds())
    return str(out["ETag"]), held if isinstance(held, dict) else {}, age  # not ours, or damaged: its age decides


def _delete(store: Store, etag: str) -> None:
    """Remove the lease if its ETag is still ``etag`` (a lease taken over meanwhile is left to its holder)."""
    bucket, key = _bucket_key(store)
    try:
        store.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=etag)
    except OSError as e:
        if _precondition(e) or isinstance(e, FileNotFoundError):
            return
        now = _head(store)  # an endpoint without conditional deletes: compare, then delete
        if now is not None and now[0] == etag:
            store.fs.call_s3("delete_object", Bucket=bucket, Key=key)


def _precondition(e: OSError) -> bool:
    """Whether ``e`` is S3's 412 PreconditionFailed (or 409 ConditionalRequestConflict): s3fs raises an
    ``OSError`` from botocore's ``ClientError``, which carries the code."""
    cause = e.__cause__ or e.__context__
    code = getattr(cause, "response", {}).get("Error", {}).get("Code", "") if cause is not None else ""
    return code in ("PreconditionFailed", "ConditionalRequestConflict")
