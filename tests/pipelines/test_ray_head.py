"""pipelines/ray_head.py against real sockets on 127.0.0.1: a listening port answers, a closed one is refused,
and the watch calls ``on_lost`` once the port stays closed for its grace, never while it answers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from pipelines.ray_head import RayHeadLost, check_head, default_grace_s, gcs_endpoint, unanswered, watch_head


@contextmanager
def listening() -> Iterator[tuple[socket.socket, int]]:
    """A socket listening on a free 127.0.0.1 port (a stand-in for a GCS: the watch only connects)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    try:
        yield s, int(s.getsockname()[1])
    finally:
        s.close()


def closed_port() -> int:
    with listening() as (_, port):
        pass
    return port


def test_addresses() -> None:
    assert gcs_endpoint("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert gcs_endpoint("ray://head:10001") == ("head", 10001)
    assert gcs_endpoint("[::1]:6379") == ("::1", 6379)
    assert [gcs_endpoint(a) for a in (None, "", "auto", "local", "head")] == [None] * 5


def test_a_listening_port_answers_and_a_closed_one_is_refused() -> None:
    with listening() as (_, port):
        assert unanswered(("127.0.0.1", port)) is None
    assert unanswered(("127.0.0.1", closed_port())) == "connection refused"


def test_check_head_raises_one_line_naming_the_address() -> None:
    address = f"127.0.0.1:{closed_port()}"
    with pytest.raises(RayHeadLost, match=rf"the Ray head at {address} does not answer \(connection refused\)"):
        check_head(address, tries=2, wait_s=0.01)
    check_head(None)  # nothing to ask: Ray starts its own
    with listening() as (_, port):
        check_head(f"127.0.0.1:{port}", tries=1)


def test_the_watch_reports_a_head_that_stops_answering_once() -> None:
    lost: list[RayHeadLost] = []
    called = threading.Event()

    def on_lost(e: RayHeadLost) -> None:
        lost.append(e)
        called.set()

    with listening() as (server, port), watch_head(f"127.0.0.1:{port}", on_lost, grace_s=0.3, poll_s=0.05):
        time.sleep(0.5)
        assert not lost, "a head that answers is not lost"
        server.close()
        assert called.wait(10), "the watch said nothing of a closed port"
        time.sleep(0.5)
    assert len(lost) == 1 and f"127.0.0.1:{port} stopped answering" in str(lost[0])


def test_the_grace_stays_under_rays_own_timeout() -> None:
    assert default_grace_s({}) == 20.0
    assert default_grace_s({"RAY_gcs_rpc_server_reconnect_timeout_s": "10"}) == 5.0
