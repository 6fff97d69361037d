"""One build at a time per object-store root: a lease object taken and renewed with conditional writes, and the
fence that keeps a build that lost it from publishing anything more.

A local output is guarded by an ``flock`` (:func:`pipelines.output_lock.output_lock`), which the kernel
releases when its holder dies. Two drivers on two machines building into one ``s3://`` root share no kernel:
the root holds the lease instead, the object :data:`LEASE_NAME`, JSON naming its holder (host, pid, start), its
``ttl`` and its ``generation``. It is created only if absent (``If-None-Match: *``), renewed every ``ttl / 4``
seconds and released only by its holder (``If-Match`` its last ETag), so two drivers never both hold it. A holder
killed with ``kill -9`` stops renewing: once the object is older than its ``ttl`` by the server's own clock (its
``Last-Modified`` against the ``Date`` of the answer, so the machines' clocks do not matter; one second more for
the headers' whole seconds), the next build takes it over, again with ``If-Match``, so of two drivers taking
over one stale lease exactly one succeeds. The ``generation`` grows with every new holder: the holder's start,
in seconds since 1970, or one more than the holder it took the lease over from, whichever is larger.

**Fencing.** While it holds the lease, a build fences the root (:func:`contract.fence.fenced`): every write and
removal under it in this process is first admitted by the :class:`Lease`. The publish points (each stage's
commit record and the shards' manifest, written or removed) are admitted only after a renewal that the server
accepted (``If-Match`` the last ETag: the lease is still this build's, and now for a whole ``ttl``); any other
write only after one in the last ``ttl / 2`` seconds (the renewal thread's, normally; a build that was paused
or cut off renews first). Commit records carry the lease's ``generation``. A build that lost the lease publishes
nothing more: its next write raises :class:`LeaseLost`, one line naming the root, who holds it now, and what to
do. What it cannot stop is a request already on its way: a writer stalled for longer than the whole ``ttl``
between an admission and its request's arrival lands that one request. A shard file so landed fails the other
build's manifest's checksums; a commit record so landed carries the stale, smaller generation.

**Renewal.** The renewal thread tells failures apart: the lease taken over (``PreconditionFailed``) or removed
(``NoSuchKey``) is lost at once; an endpoint that does not answer (refused or timed-out connections, botocore's
and aiohttp's errors, a server error) is retried every second or so; past the lease's ttl nothing more is written
(the fence wants a renewal), and a renewal that then lands, conditional on this build's ETag, which any
take-over changes, proves no other build held the lease meanwhile; none within ``WEIR_OUTAGE_S`` after the ttl
loses it. Anything else loses it too, with its reason. The thread never ends without saying
why. Renewals use their own S3 client (:mod:`pipelines.lease_object`: short timeouts, no retries of its own,
every request cancelled after them), so the thread keeps its beat through an outage.

``ttl`` is :data:`DEFAULT_TTL` seconds, or ``WEIR_LEASE_TTL``; a build rides out an endpoint outage
(:mod:`pipelines.outage`) only while the lease is sure to be its own, so the default is twice the default
outage limit. Only ``s3://`` roots (and S3-compatible endpoints) have these conditional writes; another remote
protocol builds without a lease, saying so. The Dagster steps of ``weir build``'s own run write under the lease
their process holds (:func:`held_lease`); other Dagster runs take it (:mod:`pipelines.resources`).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from contract.errors import WeirError, first_line
from contract.fence import fenced
from contract.manifest import MANIFEST
from contract.redaction import redact_url
from contract.store import Store
from mixing.output.commit import COMMITS
from pipelines.lease_object import LEASE_NAME, Refused, delete, head, lease_fs, put, request_timeout
from pipelines.outage import DEFAULT_OUTAGE_S, EndpointUnreachable, outage_limit, unreachable

__all__ = ["DEFAULT_TTL", "LEASE_NAME", "TTL_ENV", "BuildBusy", "Lease", "LeaseLost", "held_lease", "root_lease"]

DEFAULT_TTL = 2 * DEFAULT_OUTAGE_S
TTL_ENV = "WEIR_LEASE_TTL"
_CLOCK_S = 1.0  # Last-Modified and Date have whole seconds: a lease is taken over only past ttl + this


class BuildBusy(WeirError):
    """Another ``weir build`` is building into the same output: it holds a local output's lock
    (:func:`pipelines.output_lock.output_lock`) or renews an object-store root's lease."""


class LeaseLost(WeirError):
    """This build's lease was taken over, removed, or could not be renewed within its ttl: it publishes nothing
    more into the root."""


class Lease:
    """The lease of one root, held by this process: renewed by a daemon thread until :meth:`release`, and the
    root's :class:`~contract.fence.Fence` meanwhile (:meth:`admit`)."""

    def __init__(
        self, store: Store, fs: Any, taken: tuple[str, float], body: dict[str, Any], say: Callable[[str], None]
    ) -> None:
        """``taken``: the ETag of the lease object this build wrote, and when (``time.monotonic()``) it sent it."""
        self._store, self._fs, self._body, self._say = store, fs, body, say
        self._etag, self._confirmed = taken  # the server's Last-Modified is no older than the request's sending
        self.ttl = float(body["ttl"])
        self.generation = int(body["generation"])
        self.released = False
        self._lost: str | None = None
        self._told = False
        self._lock = threading.Lock()  # one conditional request at a time: the thread's and a publisher's
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="weir-lease", daemon=True)
        self._thread.start()

    @property
    def lost(self) -> str | None:
        """Why this build no longer holds the lease, or None while it does."""
        return self._lost

    def deadline(self) -> float:
        """Until when (``time.monotonic()``) the lease is sure to be this build's: no other build can take it
        over before its ttl has passed since its last renewal that the server accepted."""
        return self._confirmed + self.ttl

    def admit(self, name: str) -> None:
        """Return if this build may still write or remove ``name`` in the root, else raise :class:`LeaseLost`
        (the :class:`~contract.fence.Fence` of the root; see the module's docstring)."""
        if self._lost is None and not _publishes(name) and time.monotonic() - self._confirmed < self.ttl / 2:
            return
        self.confirm()

    def confirm(self) -> None:
        """Renew the lease now, conditionally on its last ETag; raise :class:`LeaseLost` if it is no longer this
        build's. Through an outage, tries again until the ttl and the outage limit have passed."""
        while True:
            with self._lock:
                if self._lost is None:
                    try:
                        self._renew_now()
                        return
                    except Exception as e:
                        self._failed(e)
                if self._lost is not None:
                    raise self._error()
            time.sleep(min(1.0, self.ttl / 8))

    def check(self) -> None:
        """Raise :class:`LeaseLost` if this build lost the lease while it held it."""
        if self._lost is not None:
            raise self._error()

    def release(self) -> None:
        """Stop renewing and remove the lease object, if it is still this build's (``released`` says whether it
        was removed). A removal that fails (the store unreachable) leaves the lease to expire after its ttl: the
        next build takes it over, saying so. Never raises."""
        self._stop.set()
        self._thread.join(2 * request_timeout(self.ttl) + 1)  # a request in flight ends within its timeouts
        with self._lock:
            if self._lost is not None:
                return
            try:
                delete(self._store, self._fs, self._etag)
                self.released = True
            except Exception:  # unreachable: left to expire, as the caller says
                pass

    def _renew(self) -> None:
        """The renewal thread: a renewal every ttl / 4 s, sooner after a failure; ends only when released or
        lost, and marks the lease lost with the reason whatever ends it otherwise."""
        try:
            wait = self.ttl / 4
            while not self._stop.wait(wait):
                with self._lock:
                    if self._lost is not None:
                        return
                    try:
                        self._renew_now()
                        wait = self.ttl / 4
                    except Exception as e:
                        self._failed(e)
                        if self._lost is not None:
                            return
                        wait = min(1.0, self.ttl / 8)
        except BaseException as e:  # never a silent death: whatever stops renewals loses the lease, saying why
            self._lost = self._lost or f"its renewal stopped: {type(e).__name__}: {first_line(e)}"

    def _renew_now(self) -> None:
        """One conditional renewal (call with the lock held); raises what the request raised. A renewal refused
        because an earlier one of this build's, timed out here, landed after all is adopted and sent again."""
        for _ in range(2):
            sent = time.monotonic()
            body = {**self._body, "beat": int(self._body.get("beat", 0)) + 1}
            try:
                self._etag = put(self._store, self._fs, body, if_match=self._etag)
            except Refused:
                now = head(self._store, self._fs)
                if now is None or any(now[1].get(k) != self._body.get(k) for k in ("holder", "started", "generation")):
                    raise
                self._etag, self._body = now[0], {**self._body, "beat": now[1].get("beat", 0)}
                continue
            self._body, self._confirmed = body, sent  # the server's Last-Modified is no older than `sent`
            break
        if self._told:
            self._say(f"{redact_url(self._store.url)}: lease renewed again")
            self._told = False

    def _failed(self, e: Exception) -> None:
        """Judge a failed renewal (call with the lock held): lost at once, or tried again until the deadline."""
        if isinstance(e, Refused):
            self._lost = e.why
        elif not unreachable(e):
            self._lost = f"its renewal failed: {type(e).__name__}: {first_line(e)}"
        elif time.monotonic() + min(1.0, self.ttl / 8) >= self.deadline() + outage_limit():
            # Past the ttl the lease may have been taken over, so nothing is written (the fence wants a renewal);
            # but a renewal that lands later is conditional on this build's ETag, which any take-over changes: it
            # succeeding proves no other build held the lease meanwhile. So wait for one as long as an outage may last.
            self._lost = (
                f"the endpoint did not answer for its ttl of {self.ttl:g} s and {outage_limit():g} s of outage "
                f"({first_line(e)})"
            )
        elif not self._told:
            left = self.deadline() + outage_limit() - time.monotonic()
            self._say(
                f"warning: {redact_url(self._store.url)}: endpoint unreachable, renewing the lease again for up "
                f"to {left:.0f} s ({type(e).__name__}); nothing is written past its ttl until it is renewed"
            )
            self._told = True

    def _error(self) -> LeaseLost:
        try:
            now = head(self._store, self._fs)
        except Exception as e:  # who holds it now, if the endpoint says
            now, holder = None, f"who holds it now is not known ({type(e).__name__})"
        else:
            holder = "no build holds it now (the build that took it over has finished, or it was removed)"
        if now is not None:
            held = now[1]
            holder = f"held now by {held.get('holder', 'unknown')} (generation {held.get('generation', '?')})"
        return LeaseLost(
            f"{redact_url(self._store.url)}: this build lost the root's lease (generation {self.generation}: "
            f"{self._lost}); {holder}. It published nothing after that: the root holds what the other build "
            "committed. Check it with `weir inspect`, and build again (with --wait) if you still need this build"
        )


_HELD: dict[tuple[str, str], Lease] = {}
_HELD_LOCK = threading.Lock()


@contextmanager
def root_lease(
    store: Store, wait: bool, say: Callable[[str], None], ttl: float | None = None
) -> Iterator[Lease | None]:
    """Hold the lease of the remote root ``store`` and fence the root with it for the ``with`` block (``None``
    where the protocol has no conditional writes, said once). Raises :class:`BuildBusy` naming the holder when
    another driver holds it and ``wait`` is false; with ``wait``, polls until it is released or expires. Raises
    :class:`LeaseLost` on exit if the lease was lost meanwhile. (A second call for the same root in the same
    process contends for the lease like another driver: see :func:`held_lease`.)"""
    if store.protocol not in ("s3", "s3a"):  # fsspec has no conditional writes for the others
        say(f"{store.url}: {store.protocol}:// has no conditional writes: nothing keeps another build out of this root")
        yield None
        return
    key = (store.protocol, store.root.rstrip("/"))
    ttl = _ttl() if ttl is None else ttl
    try:
        lease = _acquire(store, lease_fs(store, ttl), wait, say, ttl)
    except Exception as e:
        if not unreachable(e):
            raise
        raise EndpointUnreachable(
            f"build root {redact_url(store.url)}: the endpoint did not answer while this build took the root's lease "
            f"({type(e).__name__}: {first_line(e)}); nothing was written: build again once it answers"
        ) from None
    with _HELD_LOCK:
        _HELD[key] = lease
    try:
        with fenced(store, lease):
            yield lease
    finally:
        with _HELD_LOCK:
            _HELD.pop(key, None)
        lease.release()
    lease.check()


def held_lease(store: Store) -> Lease | None:
    """The lease of ``store``'s root that this process holds (:func:`root_lease`), if any: what the steps of
    ``weir build``'s own Dagster run write under, rather than taking the lease again."""
    with _HELD_LOCK:
        return _HELD.get((store.protocol, store.root.rstrip("/")))


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


ACQUIRE_TRIES = 3  # requests of the lease that may go unanswered while it is taken, before the build gives up


def _acquire(store: Store, fs: Any, wait: bool, say: Callable[[str], None], ttl: float) -> Lease:
    host = socket.gethostname()
    started = datetime.now(UTC)
    body: dict[str, Any] = {
        "holder": f"{host} pid {os.getpid()}",
        "started": started.isoformat(timespec="seconds"),
        "ttl": ttl,
        "beat": 0,
        "generation": int(started.timestamp()),
        "take": secrets.token_hex(8),  # this attempt's own: a lease read back is ours only if it carries it
    }
    waiting = False
    failed, first_sent = 0, None
    while True:
        try:
            try:
                sent = time.monotonic()
                first_sent = sent if first_sent is None else first_sent
                return Lease(store, fs, (put(store, fs, body, if_match=None), sent), body, say)
            except Refused:
                pass
            now = head(store, fs)
        except Exception as e:
            # a busy endpoint may not answer one of the lease's short requests: try again, a few times
            failed += 1
            if not unreachable(e) or failed >= ACQUIRE_TRIES:
                raise
            time.sleep(min(1.0, ttl / 4))
            continue
        if now is None:
            time.sleep(0.05)
            continue  # released between the two requests
        etag, held, age = now
        if held == body and first_sent is not None:
            # our own write landed though its answer did not come: the lease is ours, as old as our first try
            return Lease(store, fs, (etag, first_sent), body, say)
        first_sent = None
        declared = held.get("ttl")
        their_ttl = float(declared) if isinstance(declared, int | float) else DEFAULT_TTL  # damaged: the default
        if age >= their_ttl + _CLOCK_S:
            previous = held.get("generation")
            if isinstance(previous, int):
                body["generation"] = max(body["generation"], previous + 1)
            try:
                sent = time.monotonic()
                lease = Lease(store, fs, (put(store, fs, body, if_match=etag), sent), body, say)
            except Refused:
                continue  # another driver took it over first, or its holder renewed it just now
            say(f"took over the lease of {store.url} from {held.get('holder', 'unknown')}: not renewed for {age:.0f} s")
            return lease
        holder = f"{held.get('holder', 'unknown')} (since {held.get('started', '?')}, renewed {age:.0f} s ago)"
        if not wait:
            raise BuildBusy(
                f"{store.url}: another weir build holds this root's lease: {holder}; wait for it, or pass --wait "
                f"to start when it is done (a killed build's lease expires {their_ttl + _CLOCK_S - age:.0f} s from now)"
            )
        if not waiting:
            say(f"waiting for the build of {holder} into {store.url} to finish")
            waiting = True
        time.sleep(min(2.0, their_ttl / 4))


def _publishes(name: str) -> bool:
    """Whether writing or removing ``name`` (relative to the root) changes what a reader trusts: a commit
    record, the shards' manifest, or a folder holding them."""
    return name in ("", COMMITS, "shards", f"shards/{MANIFEST}") or name.startswith(f"{COMMITS}/")
