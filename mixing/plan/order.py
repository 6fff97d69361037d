"""The draw order: a source's documents in a seeded order, fresh for every epoch, sorted by DuckDB out of core.

Each document gets a 64-bit key, ``mix64(doc_id + epoch_key(seed, source, epoch))`` (splitmix64's finalizer:
a bijection of 64-bit integers whose outputs look independent of one another), and the epoch's order is the
documents sorted by (key, doc_id). The keys are computed and sorted in SQL, so the order of any number of
documents is made within DuckDB's ``memory_limit`` (it spills past it) and read back a chunk at a time: the
planner never holds an array per document. The same documents, seed, source name and epoch give the same
order on every machine and every DuckDB version (integer arithmetic only, ties broken by doc_id).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterator

import duckdb
import numpy as np

__all__ = ["DrawOrder", "SortedOrder", "epoch_key", "mix64"]

DrawOrder = Callable[[int, int], Iterator[tuple[np.ndarray, np.ndarray]]]
"""``order(epoch, chunk)``: the source's (doc_id, n_tokens) int64 arrays of at most ``chunk`` documents each,
in the epoch's draw order; the concatenation over chunks does not depend on ``chunk``."""

_MASK = (1 << 64) - 1
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB
_TABLES = itertools.count()  # each order its own temp table: two orders on one connection never share one


def mix64(x: np.ndarray | int) -> np.ndarray:
    """splitmix64's finalizer over uint64 (wrapping), elementwise: what :class:`SortedOrder` computes in SQL."""
    z = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        z ^= z >> np.uint64(30)
        z *= np.uint64(_M1)
        z ^= z >> np.uint64(27)
        z *= np.uint64(_M2)
        z ^= z >> np.uint64(31)
    return z


def epoch_key(seed: int, source: str, epoch: int) -> int:
    """The 64-bit key offset of ``source``'s order in ``epoch`` under the mix ``seed`` (blake2b of the three)."""
    digest = hashlib.blake2b(f"{seed}\x00{source}\x00{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def _sql_mix64(x: str) -> str:
    """:func:`mix64` of the UBIGINT expression ``x`` in DuckDB SQL: products in UHUGEINT, masked to 64 bits."""
    z = f"({x})"
    z = f"(xor({z}, {z} >> 30)::UHUGEINT * {_M1}::UHUGEINT & {_MASK}::UHUGEINT)::UBIGINT"
    z = f"(xor({z}, {z} >> 27)::UHUGEINT * {_M2}::UHUGEINT & {_MASK}::UHUGEINT)::UBIGINT"
    return f"xor({z}, {z} >> 31)"


class SortedOrder:
    """The draw order of ``source``'s rows in the ``documents`` table of ``con``, a :data:`DrawOrder` (see the
    module's contract); use it as a context manager (its table is dropped on exit).

    An epoch's order is sorted into a temp table (``_draw_order_<n>``, its own) when first read, and kept
    while the same epoch is read again (each length segment of the plan walks the order from its start); it
    is read back by row ranges, so the connection stays free for other statements between chunks (the
    planner inserts what it draws). One epoch is held at a time: reading another sorts it in its place.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, source: str, seed: int) -> None:
        self._con, self._source, self._seed = con, source, seed
        self._table = f"_draw_order_{next(_TABLES)}"
        self._epoch: int | None = None  # the epoch whose order the table holds
        self._n = 0

    def __call__(self, epoch: int, chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if self._epoch != epoch:
            self._sort(epoch)
        for lo in range(0, self._n, chunk):
            t = self._con.sql(
                f"SELECT doc_id, n_tokens FROM {self._table} "
                f"WHERE rowid >= {lo} AND rowid < {lo + chunk} ORDER BY rowid"
            ).fetchnumpy()
            yield t["doc_id"].astype(np.int64), t["n_tokens"].astype(np.int64)

    def _sort(self, epoch: int) -> None:
        key = epoch_key(self._seed, self._source, epoch)
        plus = f"(doc_id::UBIGINT::UHUGEINT + {key}::UHUGEINT & {_MASK}::UHUGEINT)::UBIGINT"
        self._epoch = None  # until the table holds this epoch's order
        self._con.execute(
            f"CREATE OR REPLACE TEMP TABLE {self._table} AS "
            "SELECT doc_id::BIGINT AS doc_id, n_tokens::BIGINT AS n_tokens "
            f"FROM documents WHERE source = ? ORDER BY {_sql_mix64(plus)}, doc_id",
            [self._source],
        )
        (self._n,) = self._con.sql(f"SELECT count(*) FROM {self._table}").fetchall()[0]
        self._epoch = epoch

    def close(self) -> None:
        """Drop the sorted table."""
        self._con.execute(f"DROP TABLE IF EXISTS {self._table}")
        self._epoch = None

    def __enter__(self) -> SortedOrder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
