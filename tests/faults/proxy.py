"""A fault-injecting TCP proxy for tests: forwards bytes between its clients and one upstream endpoint (a local
``moto_server``), and can be cut and resumed, so that an object store's outage is a real network fault.

Two kinds of cut, as outages look to a client:

- ``refuse``: the listening socket is closed and every live connection reset, so a new connection is refused
  (``ECONNREFUSED``: botocore's ``EndpointConnectionError``), as when the endpoint is down;
- ``stall``: connections are still accepted but nothing is forwarded either way, and live ones stop moving (a
  client waits out its timeouts: botocore's ``ReadTimeoutError``), as when the network is cut. On resume the
  stalled connections are closed, so no request held during the cut reaches the endpoint afterwards.

:meth:`FaultProxy.cut` takes an optional duration after which the proxy resumes by itself.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from typing import Literal

__all__ = ["CutMode", "FaultProxy"]

CutMode = Literal["refuse", "stall"]
_BLOCK = 1 << 16


class FaultProxy:
    """A proxy on ``127.0.0.1`` (a free port, kept across cuts) in front of ``upstream`` (``host:port``).

    ``url`` is ``http://127.0.0.1:<port>``. Use it as a context manager; :meth:`close` stops it, closing every
    connection. ``connections`` counts the connections accepted (a test can see that traffic went through).
    """

    def __init__(self, upstream: str) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").rpartition(":")
        self.upstream = (host, int(port))
        self._lock = threading.Lock()
        self._cut: CutMode | None = None
        self._closed = False
        self._live: set[socket.socket] = set()
        self._timer: threading.Timer | None = None
        self.connections = 0
        self._listener: socket.socket | None = self._listen(0)
        self.port = int(self._listener.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._acceptor = self._start_acceptor()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def is_cut(self) -> CutMode | None:
        return self._cut

    def cut(self, mode: CutMode = "refuse", seconds: float | None = None) -> None:
        """Cut the endpoint off (see the module's docstring); with ``seconds``, resume after that long."""
        with self._lock:
            if self._cut is not None:
                raise RuntimeError(f"already cut ({self._cut})")
            self._cut = mode
            if mode == "refuse":
                self._drop_live()
                listener, self._listener = self._listener, None
        if mode == "refuse" and listener is not None:
            _close(listener)
            self._acceptor.join(5)
        if seconds is not None:
            self._timer = threading.Timer(seconds, self.resume)
            self._timer.daemon = True
            self._timer.start()

    def resume(self) -> None:
        """Forward again: the listening socket reopened on the same port (``refuse``), the connections held
        during a ``stall`` closed. Resuming a proxy that is not cut does nothing."""
        with self._lock:
            mode, self._cut = self._cut, None
            if mode == "stall":
                self._drop_live()
        if mode == "refuse" and not self._closed:
            self._listener = self._listen(self.port)
            self._acceptor = self._start_acceptor()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._closed = True
            self._drop_live()
            listener, self._listener = self._listener, None
        if listener is not None:
            _close(listener)

    # -- internals

    def _listen(self, port: int) -> socket.socket:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(128)
        return s

    def _start_acceptor(self) -> threading.Thread:
        listener = self._listener
        assert listener is not None
        t = threading.Thread(target=self._accept, args=(listener,), name="fault-proxy-accept", daemon=True)
        t.start()
        return t

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by cut() or close()
                return
            with self._lock:
                if self._closed:
                    _close(client)
                    return
                self.connections += 1
                self._live.add(client)
                stalled = self._cut == "stall"
            if stalled:
                continue  # held, never forwarded; closed on resume
            try:
                up = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                self._forget(client)
                continue
            up.settimeout(None)
            with self._lock:
                self._live.add(up)
            for a, b in ((client, up), (up, client)):
                threading.Thread(target=self._pump, args=(a, b), name="fault-proxy-pump", daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(_BLOCK)
            except OSError:
                data = b""
            held = False
            while data and self._cut == "stall":  # hold what arrived: dropped with its connection on resume
                held = True
                threading.Event().wait(0.05)
            if not data or held:
                break
            try:
                dst.sendall(data)
            except OSError:
                break
        self._forget(src)
        self._forget(dst)

    def _forget(self, s: socket.socket) -> None:
        with self._lock:
            self._live.discard(s)
        _close(s)

    def _drop_live(self) -> None:
        """Reset every live connection (call with the lock held)."""
        for s in self._live:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            _close(s)
        self._live.clear()


def _close(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        s.close()
