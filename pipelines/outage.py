"""Riding out an object store's outage during a build: connection errors retried for up to ``WEIR_OUTAGE_S``
seconds, said once, then one line.

The retries are s3fs's own (``s3fs.core._error_wrapper``: a request retried with a growing wait, 0.1 s times
1.7 per try, at most 15 s): s3fs retries timeouts and dropped connections by itself, but raises a refused or
unreachable endpoint (botocore's ``EndpointConnectionError``, ``ConnectTimeoutError``) at once unless its
custom error handler (``s3fs.core.set_custom_error_handler``) asks for another try. :func:`riding_outages`
installs that handler for the ``with`` block, and gives every s3fs filesystem of the process enough tries
(``S3FileSystem.retries``) for its waits to span the limit: the handler asks for another try while the outage
is younger than ``limit_s`` (and, when the build holds a lease, while the lease is sure to be still its own), so
the limit is kept by the clock, not by a count of tries. The first retry of an outage is said once
(``warning: ... endpoint unreachable, retrying for up to N s``). An outage is the time since the first
connection error after :data:`QUIET_S` seconds without one.

What the handler does not bound: a stalled connection (the network cut while a request waits for its answer)
ends in a read timeout, which s3fs retries by count alone (``S3FileSystem.retries`` tries of the read timeout
each), and an upload waiting for ``100 Continue`` on a stalled connection waits until the connection fails;
and a Ray engine's workers are other processes, where s3fs's own few retries apply.

``limit_s`` is ``WEIR_OUTAGE_S`` seconds (default :data:`DEFAULT_OUTAGE_S`, 60, as the loader's
``Reading(outage_s=...)``), 0 to fail at the first connection error.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from contract.errors import WeirError
from contract.redaction import redact_url

__all__ = [
    "DEFAULT_OUTAGE_S",
    "OUTAGE_ENV",
    "QUIET_S",
    "EndpointUnreachable",
    "Outages",
    "outage_limit",
    "riding_outages",
    "tries_for",
    "unreachable",
]

OUTAGE_ENV = "WEIR_OUTAGE_S"
DEFAULT_OUTAGE_S = 60.0  # the loader's too (loaders.remote.OUTAGE_S, Reading(outage_s=...)): not imported, as
# importing loaders imports torch
QUIET_S = 20.0  # longer than s3fs's longest wait between two tries (15 s): a gap this long ends an outage


class EndpointUnreachable(WeirError):
    """The object store did not answer for longer than the build may wait (``WEIR_OUTAGE_S``)."""


def outage_limit(env: dict[str, str] | None = None) -> float:
    """``WEIR_OUTAGE_S`` in seconds (0 to 86400), else :data:`DEFAULT_OUTAGE_S`."""
    raw = (os.environ if env is None else env).get(OUTAGE_ENV, "").strip()
    if not raw:
        return DEFAULT_OUTAGE_S
    try:
        limit = float(raw)
    except ValueError:
        limit = -1.0
    if not 0 <= limit <= 86400:
        raise WeirError(f"{OUTAGE_ENV}={raw!r}: expected seconds between 0 and 86400")
    return limit


def unreachable(e: BaseException) -> bool:
    """Whether ``e`` (or what it wraps) says the endpoint could not be reached or did not answer in time, as
    opposed to an answer (a missing key, a refused condition, denied access: those are raised as they are).
    A server error (HTTP 5xx) counts as unreachable: the endpoint is there but not serving."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        status = _http_status(cur)
        if status is not None:
            return status >= 500
        if _connection_type(cur):
            return True
        cur = getattr(cur, "user_exception", None) or cur.__cause__ or cur.__context__
    return False


def _http_status(e: BaseException) -> int | None:
    response = getattr(e, "response", None)
    if not isinstance(response, dict):
        return None
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return int(status) if isinstance(status, int) else None


def _connection_type(e: BaseException) -> bool:
    try:  # botocore: EndpointConnectionError, ConnectTimeoutError (ConnectionError); ReadTimeoutError, ...
        from botocore.exceptions import ConnectionError as BotoConnectionError
        from botocore.exceptions import HTTPClientError
    except ImportError:  # no S3 support installed
        BotoConnectionError = HTTPClientError = ()  # type: ignore[assignment,misc]
    try:
        from aiohttp import ClientError as AioClientError
    except ImportError:
        AioClientError = ()  # type: ignore[assignment,misc]
    from fsspec.exceptions import FSTimeoutError

    if isinstance(e, BotoConnectionError | HTTPClientError | AioClientError | FSTimeoutError | asyncio.TimeoutError):
        return True
    if isinstance(e, FileNotFoundError | FileExistsError | PermissionError | IsADirectoryError | NotADirectoryError):
        return False
    return isinstance(e, ConnectionError | TimeoutError) or (isinstance(e, OSError) and e.__cause__ is None)


def tries_for(limit_s: float) -> int:
    """The s3fs tries whose waits (0.1 s × 1.7^i, at most 15 s each) add up to ``limit_s`` and one more wait."""
    n, total = 1, 0.0
    while total < limit_s + 15:
        total += min(1.7 ** (n - 1) * 0.1, 15.0)
        n += 1
    return n


class Outages:
    """The outage state of one build (see the module's docstring): ``exceeded`` holds the error that ended
    the retries, once an outage outlasted the limit (or the lease's certainty)."""

    def __init__(
        self, where: str, limit_s: float, say: Callable[[str], None], until: Callable[[], float] | None = None
    ) -> None:
        self.where, self.limit_s, self.say, self.until = where, limit_s, say, until
        self.exceeded: BaseException | None = None
        self.waited = 0  # outages retried (each said once)
        self._since: float | None = None
        self._last = 0.0
        self._lock = threading.Lock()

    def retry(self, e: BaseException) -> bool:
        """Whether to try the failed request again (called by s3fs for each error it does not retry itself)."""
        if not unreachable(e):
            return False
        now = time.monotonic()
        with self._lock:
            if self._since is None or now - self._last > QUIET_S:
                self._since, told = now, False
            else:
                told = True
            self._last = now
            lease_ends = self.until() if self.until is not None else None
            if now - self._since >= self.limit_s or (lease_ends is not None and now >= lease_ends):
                self.exceeded = e
                return False
            if not told:
                self.waited += 1
        if not told:
            self.say(
                f"warning: {self.where}: endpoint unreachable ({type(e).__name__}), "
                f"retrying for up to {self.limit_s:g} s"
            )
        return True

    def failure(self, cause: BaseException, lease: str = "") -> EndpointUnreachable:
        """The one line of a build ended by an outage longer than it may wait (``cause``: the error that ended
        it, unless the retries recorded one); ``lease``: what became of the build's lease."""
        error = self.exceeded or cause
        text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())[:300] or "no answer"
        return EndpointUnreachable(
            f"build root {self.where}: the endpoint did not answer within {self.limit_s:g} s "
            f"({type(error).__name__}: {redact_url(text)}); the stage in progress published nothing (no commit "
            f"record lists what it wrote){'; ' + lease if lease else ''}. Build again once the endpoint answers "
            f"(every stage committed so far is reused), or allow a longer outage with {OUTAGE_ENV}"
        )


_ACTIVE: list[Outages] = []
_ACTIVE_LOCK = threading.Lock()
_SAVED: dict[str, Any] = {}


def _handler(e: Exception) -> bool:
    with _ACTIVE_LOCK:
        active = list(_ACTIVE)
    if not active:
        return bool(_SAVED.get("handler", lambda _e: False)(e))
    return all(o.retry(e) for o in active)  # every build of this process agrees, or none retries


@contextmanager
def riding_outages(
    where: str,
    say: Callable[[str], None],
    limit_s: float | None = None,
    until: Callable[[], float] | None = None,
) -> Iterator[Outages]:
    """Retry s3fs requests that fail for want of the endpoint for up to ``limit_s`` seconds of outage (default
    :func:`outage_limit`) in this process, for the ``with`` block; ``where`` names the root in the warning;
    ``until`` (monotonic seconds) is when the build's lease stops being sure to be its own: no retry after it."""
    outages = Outages(where, outage_limit() if limit_s is None else limit_s, say, until)
    try:
        import s3fs.core
    except ImportError:  # no s3: nothing to retry
        yield outages
        return
    with _ACTIVE_LOCK:
        if not _ACTIVE:
            _SAVED["handler"] = s3fs.core.CUSTOM_ERROR_HANDLER
            _SAVED["retries"] = s3fs.core.S3FileSystem.retries
            s3fs.core.set_custom_error_handler(_handler)
        _ACTIVE.append(outages)
        s3fs.core.S3FileSystem.retries = max(_SAVED["retries"], *(tries_for(o.limit_s) for o in _ACTIVE))
    try:
        yield outages
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE.remove(outages)
            if _ACTIVE:
                s3fs.core.S3FileSystem.retries = max(_SAVED["retries"], *(tries_for(o.limit_s) for o in _ACTIVE))
            else:
                s3fs.core.set_custom_error_handler(_SAVED.pop("handler"))
                s3fs.core.S3FileSystem.retries = _SAVED.pop("retries")
