"""What the lease tests share (``test_lease*.py``, of ``pipelines/lease.py``): the checkout's root (drivers run
as child processes from it), the short ttl they take leases with, the lease's holder as its object names it, and
a wait for a condition with a deadline."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from contract.store import Store
from pipelines.lease import LEASE_NAME

__all__ = ["ROOT", "TTL", "holder", "wait_until"]

ROOT = Path(__file__).resolve().parents[2]
TTL = 2.0  # seconds: short, so that renewals (every ttl / 4) and take-overs happen within a test


def holder(store: Store) -> str:
    """The ``holder`` that the lease object under ``store`` names (host, pid, start)."""
    return str(json.loads(store.read(LEASE_NAME))["holder"])


def wait_until(what: str, done: Any, timeout_s: float = 20.0) -> None:
    """Poll ``done()`` every 50 ms until it is true; fail naming ``what`` after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)
