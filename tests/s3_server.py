"""The tests' local S3 endpoint: moto's server, with S3's conditional writes made atomic.

S3 checks a PUT's or a DELETE's ``If-Match`` / ``If-None-Match`` and applies the request in one step, so of two
drivers writing one object conditionally on the same ETag exactly one succeeds (what ``pipelines/lease.py``
relies on). moto's threaded server checks the condition, then writes, with nothing between the two, so two
such requests arriving together can both succeed: 8 threads writing one object ``If-Match`` the same ETag had
more than one winner in 5 of 300 trials on a loaded 2-core machine, and the lease tests then failed now and
then (two threads in one process "took over" one stale lease), testing moto rather than weir. Here every
conditional PUT and DELETE of an object runs under one lock, as S3 guarantees; every other request is moto's
as it is, on its threaded server.

    python tests/s3_server.py -H 127.0.0.1 -p PORT        (moto_server's arguments)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from moto.s3.responses import S3Response
from moto.server import main

__all__ = ["main"]

_CONDITIONAL = threading.Lock()


def _atomic(handle: Callable[..., Any]) -> Callable[..., Any]:
    """``handle`` (an object's PUT or DELETE) under :data:`_CONDITIONAL` when the request is conditional."""

    def run(self: S3Response, *args: Any, **kwargs: Any) -> Any:
        if "If-Match" in self.headers or "If-None-Match" in self.headers:
            with _CONDITIONAL:
                return handle(self, *args, **kwargs)
        return handle(self, *args, **kwargs)

    return run


S3Response._key_response_put = _atomic(S3Response._key_response_put)  # type: ignore[method-assign]
S3Response._key_response_delete = _atomic(S3Response._key_response_delete)  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
