"""The DuckDB settings of a build's stages that write the build's database (``length_stats``, ``plan``).

DuckDB's own default memory limit is 80% of the machine's RAM: on a driver that shares its node, or a small
Dagster node driving a cluster, the document table of a large corpus would take that much before DuckDB
spills. A build's connections get :data:`DEFAULT_MEMORY` instead (``WEIR_DUCKDB_MEMORY_LIMIT`` overrides it),
past which DuckDB spills to ``<database>.tmp`` beside the file, so the driver's memory in these stages stops
growing with the number of documents. ``WEIR_DUCKDB_THREADS`` sets its threads (default: every core).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from contract.errors import WeirError

__all__ = ["DEFAULT_MEMORY", "MEMORY_ENV", "THREADS_ENV", "duckdb_config"]

MEMORY_ENV, THREADS_ENV = "WEIR_DUCKDB_MEMORY_LIMIT", "WEIR_DUCKDB_THREADS"
DEFAULT_MEMORY = "2GB"
_SIZE = re.compile(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)", re.IGNORECASE)


def duckdb_config(env: Mapping[str, str] = os.environ) -> dict[str, str | int]:
    """DuckDB connection settings (``memory_limit``, and ``threads`` when set) from ``env``; a value DuckDB would
    refuse is a :class:`~contract.errors.WeirError` naming the variable."""
    memory = env.get(MEMORY_ENV, "").strip() or DEFAULT_MEMORY
    if not _SIZE.fullmatch(memory):
        raise WeirError(f"{MEMORY_ENV}={memory!r}: expected a size such as 2GB or 512MB")
    config: dict[str, str | int] = {"memory_limit": memory}
    threads = env.get(THREADS_ENV, "").strip()
    if threads:
        if not threads.isdigit() or int(threads) < 1:
            raise WeirError(f"{THREADS_ENV}={threads!r}: expected a whole number of threads, 1 or more")
        config["threads"] = int(threads)
    return config
