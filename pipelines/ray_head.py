"""Whether the Ray head a build drives is alive: one TCP connection to its GCS port.

Ray does not tell a driver that its head is gone in a way a build can report. ``ray.init`` to a dead head
retries for minutes (``RAY_NUM_REDIS_GET_RETRIES`` tries of about 40 s each); a driver whose head dies during a
build waits in ``ray.get`` until Ray's core worker ends the process, ``gcs_rpc_server_reconnect_timeout_s``
(60 s) later, printing only "Failed to connect to GCS". Those waits take no Python exception but
``KeyboardInterrupt``, which Dagster's run captures. So ``weir build`` asks the head itself: :func:`check_head`
before the build (seconds, nothing started), and :func:`watch_head` during it: a thread that calls ``on_lost``
once the head has not answered for ``grace_s`` seconds, before Ray would end the process without a word.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from contract.errors import WeirError

__all__ = ["RayHeadLost", "check_head", "default_grace_s", "gcs_endpoint", "unanswered", "watch_head"]


class RayHeadLost(WeirError):
    """The Ray head (its GCS) at the build's address does not answer."""


def gcs_endpoint(address: str | None) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address (``host:port``, ``ray://host:port``, ``[v6]:port``); None when it names
    no endpoint to ask (unset, ``auto``, ``local``: Ray starts or finds one itself)."""
    if not address or address in ("auto", "local"):
        return None
    rest = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def unanswered(endpoint: tuple[str, int], timeout_s: float = 2.0) -> str | None:
    """Why ``endpoint`` does not take a TCP connection within ``timeout_s`` (``connection refused``, ``timed
    out``, ...), or None when it does."""
    try:
        socket.create_connection(endpoint, timeout=timeout_s).close()
    except TimeoutError:
        return "timed out"
    except OSError as e:
        return (e.strerror or type(e).__name__).lower()
    return None


def check_head(address: str | None, tries: int = 3, wait_s: float = 1.0) -> None:
    """Raise :class:`RayHeadLost` when the head at ``address`` refuses ``tries`` connections ``wait_s`` apart
    (a head starting up gets that long); nothing to ask for an address naming no endpoint."""
    endpoint = gcs_endpoint(address)
    if endpoint is None:
        return
    why = None
    for i in range(tries):
        why = unanswered(endpoint)
        if why is None:
            return
        if i + 1 < tries:
            time.sleep(wait_s)
    raise RayHeadLost(f"the Ray head at {address} does not answer ({why})")


def default_grace_s(env: dict[str, str] | None = None) -> float:
    """How long the head may stay silent before the build gives up: 20 s, and under half of Ray's own
    ``RAY_gcs_rpc_server_reconnect_timeout_s`` (after which Ray ends the driver itself)."""
    env = dict(os.environ) if env is None else env
    try:
        ray_s = float(env.get("RAY_gcs_rpc_server_reconnect_timeout_s", "60"))
    except ValueError:
        ray_s = 60.0
    return max(1.0, min(20.0, ray_s / 2))


@contextmanager
def watch_head(
    address: str | None,
    on_lost: Callable[[RayHeadLost], None],
    grace_s: float | None = None,
    poll_s: float = 1.0,
) -> Iterator[None]:
    """While the block runs, ask the head at ``address`` every ``poll_s`` seconds; once it has not answered for
    ``grace_s`` (default :func:`default_grace_s`), call ``on_lost`` (once, from the watching thread: the main
    thread may be waiting in Ray and cannot be interrupted; ``on_lost`` ends the process). Nothing is watched
    for an address naming no endpoint."""
    endpoint = gcs_endpoint(address)
    if endpoint is None:
        yield
        return
    grace = default_grace_s() if grace_s is None else grace_s
    done = threading.Event()

    def watch() -> None:
        since = None
        while not done.wait(poll_s):
            why = unanswered(endpoint, timeout_s=min(2.0, poll_s * 2))
            if why is None:
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since >= grace and not done.is_set():
                on_lost(RayHeadLost(f"the Ray head at {address} stopped answering ({why}) for {grace:.0f} s"))
                return

    thread = threading.Thread(target=watch, name="weir-ray-head", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=5)
