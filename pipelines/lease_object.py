"""The lease object's requests (:mod:`pipelines.lease`): conditional writes and reads of one small object in an
``s3://`` root, on a client of their own whose every request ends within the lease's timeouts.

:func:`put` creates the object if absent (``If-None-Match: *``) or replaces it if its ETag is still the one given
(``If-Match``), and raises :class:`Refused` when the condition does not hold (another ETag: taken over; no object:
removed). :func:`head` reads it with its age by the server's own clock. :func:`delete` removes it only if its ETag
is still the one given. Requests go through :func:`lease_fs`'s filesystem: short timeouts, one try (the lease
decides when to try again), each request cancelled after its timeouts even where no read timeout applies (an
upload waiting for ``100 Continue`` on a stalled connection), so that a renewal never hangs.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import fsspec
import fsspec.asyn

from contract.store import Store
from pipelines.outage import unreachable

__all__ = ["LEASE_NAME", "Refused", "delete", "head", "lease_fs", "put", "request_timeout"]

LEASE_NAME = ".weir-build.lease"


class Refused(Exception):
    """A conditional write whose condition did not hold (``why``: taken over, or removed)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def lease_fs(store: Store, ttl: float) -> Any:
    """A filesystem of its own for the lease's requests: short timeouts, one try (the lease decides when to
    try again), so that neither a stalled request nor the build's outage retries hold up a renewal."""
    timeout = request_timeout(ttl)
    options = {**store.storage_options, "skip_instance_cache": True, "use_listings_cache": False}
    config = {"connect_timeout": timeout, "read_timeout": timeout, "retries": {"total_max_attempts": 1}}
    options["config_kwargs"] = {**options.get("config_kwargs", {}), **config}
    fs = fsspec.core.url_to_fs(store.url, **options)[0]
    fs.retries = 1  # s3fs's own tries (a class attribute that pipelines.outage raises during a build)
    fs.lease_timeout_s = 2 * timeout
    return fs


def request_timeout(ttl: float) -> float:
    """Seconds a lease request may take to connect, and to be answered."""
    return min(10.0, max(1.0, ttl / 8))


def _bucket_key(store: Store) -> tuple[str, str]:
    bucket, _, prefix = store.root.partition("/")
    return bucket, f"{prefix}/{LEASE_NAME}" if prefix else LEASE_NAME


def _call(fs: Any, method: str, **kwargs: Any) -> Any:
    """``fs.call_s3(method, **kwargs)`` cancelled after the lease's timeouts (``fs.lease_timeout_s``): a request
    held by a stalled connection (waiting for ``100 Continue``, which no read timeout covers) never holds up the
    lease; a cancelled request raises :class:`TimeoutError`. The client is made before the clock starts: making
    it sends nothing, yet takes a second of CPU on a first use (loading botocore's models), which on a loaded
    machine used the whole bound of a lease's first request."""

    async def bounded() -> Any:
        await fs.set_session()
        return await asyncio.wait_for(fs._call_s3(method, **kwargs), fs.lease_timeout_s)

    return fsspec.asyn.sync(fs.loop, bounded)


def put(store: Store, fs: Any, body: dict[str, Any], if_match: str | None) -> str:
    """Write the lease if absent (``if_match`` None) or if its ETag is ``if_match``; its new ETag. Raises
    :class:`Refused` when the condition does not hold: another ETag (taken over), or, with ``if_match``, no
    object at all (removed)."""
    bucket, key = _bucket_key(store)
    condition = {"IfNoneMatch": "*"} if if_match is None else {"IfMatch": if_match}
    try:
        out = _call(fs, "put_object", Bucket=bucket, Key=key, Body=json.dumps(body).encode(), **condition)
    except FileNotFoundError:
        if if_match is None:
            raise
        raise Refused("its object was removed") from None
    except OSError as e:
        if _precondition(e):
            raise Refused("another build took it over") from None
        raise
    return str(out["ETag"])


def head(store: Store, fs: Any) -> tuple[str, dict[str, Any], float] | None:
    """The lease's (ETag, body, age in seconds by the server's clock), or None when there is none."""
    bucket, key = _bucket_key(store)
    try:
        out = _call(fs, "get_object", Bucket=bucket, Key=key)
        data = fsspec.asyn.sync(fs.loop, _read, out["Body"], fs.lease_timeout_s)
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


async def _read(body: Any, timeout: float) -> bytes:
    try:
        return bytes(await asyncio.wait_for(body.read(), timeout))
    finally:
        body.close()


def delete(store: Store, fs: Any, etag: str) -> None:
    """Remove the lease if its ETag is still ``etag`` (a lease taken over meanwhile is left to its holder)."""
    bucket, key = _bucket_key(store)
    try:
        _call(fs, "delete_object", Bucket=bucket, Key=key, IfMatch=etag)
    except OSError as e:
        if _precondition(e) or isinstance(e, FileNotFoundError):
            return
        if unreachable(e):
            raise
        now = head(store, fs)  # an endpoint without conditional deletes: compare, then delete
        if now is not None and now[0] == etag:
            _call(fs, "delete_object", Bucket=bucket, Key=key)


def _precondition(e: OSError) -> bool:
    """Whether ``e`` is S3's 412 PreconditionFailed (or 409 ConditionalRequestConflict): s3fs raises an
    ``OSError`` from botocore's ``ClientError``, which carries the code."""
    cause = e.__cause__ or e.__context__
    code = getattr(cause, "response", {}).get("Error", {}).get("Code", "") if cause is not None else ""
    return code in ("PreconditionFailed", "ConditionalRequestConflict")
