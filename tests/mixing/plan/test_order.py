"""The draw order sorted by DuckDB: the same keys as the numpy reference, a permutation per epoch, chunk-free."""

from __future__ import annotations

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixing.plan.order import SortedOrder, epoch_key, mix64


def _documents(con: duckdb.DuckDBPyConnection, tables: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    rows = {"source": [], "doc_id": [], "n_tokens": []}  # type: ignore[var-annotated]
    for name, (ids, lens) in tables.items():
        rows["source"] += [name] * len(ids)
        rows["doc_id"] += ids.tolist()
        rows["n_tokens"] += lens.tolist()
    con.register(
        "docs_in",
        pa.table(rows, schema=pa.schema([("source", pa.string()), ("doc_id", pa.int64()), ("n_tokens", pa.int64())])),
    )
    con.execute(
        "CREATE TABLE documents AS SELECT * FROM docs_in ORDER BY source, doc_id DESC"
    )  # stored order is not the draw's


def _read(order, epoch: int, chunk: int) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    parts = list(order(epoch, chunk))
    assert all(len(ids) <= chunk for ids, _ in parts)
    empty = np.zeros(0, np.int64)
    return np.concatenate([empty] + [p[0] for p in parts]), np.concatenate([empty] + [p[1] for p in parts])


def test_mix64_is_splitmix64() -> None:
    # splitmix64's first outputs from state 0: the finalizer of 0x9E3779B97F4A7C15 and its multiples
    gamma = 0x9E3779B97F4A7C15
    expected = [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    got = [int(mix64(gamma * (i + 1) % (1 << 64))) for i in range(3)]
    assert got == expected


@settings(max_examples=25)
@given(
    n=st.integers(0, 300),
    sparse=st.booleans(),
    seed=st.integers(0, 2**63 - 1),
    epoch=st.integers(0, 5),
    chunk=st.integers(1, 64),
)
def test_the_order_is_the_documents_sorted_by_their_keys(
    n: int, sparse: bool, seed: int, epoch: int, chunk: int
) -> None:
    rng = np.random.default_rng(n)
    ids = np.sort(rng.choice(2**62, n, replace=False)) if sparse else np.arange(n, dtype=np.int64)
    lens = rng.integers(1, 10_000, n)
    with duckdb.connect() as con:
        _documents(con, {"a": (ids, lens), "b": (np.arange(7), np.full(7, 3))})
        with SortedOrder(con, "a", seed) as order:
            got_ids, got_lens = _read(order, epoch, chunk)
        plus = (ids.astype(np.uint64) + np.uint64(epoch_key(seed, "a", epoch))) if n else ids.astype(np.uint64)
        want = np.lexsort((ids, mix64(plus)))
        assert np.array_equal(got_ids, ids[want]) and np.array_equal(got_lens, lens[want])
        assert con.sql("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_draw_order%'").fetchall() == [(0,)]


def test_epochs_and_seeds_give_fresh_orders_of_the_same_documents() -> None:
    n = 2000
    with duckdb.connect() as con:
        _documents(con, {"a": (np.arange(n), np.ones(n, np.int64))})
        orders = [_read(SortedOrder(con, "a", s), e, 256)[0] for s in (1, 2) for e in (0, 1)]
    for o in orders:
        assert np.array_equal(np.sort(o), np.arange(n))
    for i in range(len(orders)):
        for j in range(i):
            assert np.mean(orders[i] == orders[j]) < 0.01  # unrelated permutations share ~1/n places
    # a fair shuffle: the first half of an order holds about half of the first half of the ids
    assert abs(np.mean(orders[0][: n // 2] < n // 2) - 0.5) < 0.05


@pytest.mark.parametrize("chunk", [1, 3, 1000])
def test_an_order_read_again_or_abandoned_is_the_same_and_leaves_no_table(chunk: int) -> None:
    with duckdb.connect() as con:
        _documents(con, {"a": (np.arange(50), np.arange(50) + 1), "b": (np.arange(9), np.ones(9, np.int64))})
        with SortedOrder(con, "a", 7) as order:
            whole = [_read(order, e, 50)[0] for e in (0, 1)]
            it = order(0, chunk)
            next(it)  # abandoned after one chunk: the next read starts over
            with SortedOrder(con, "b", 7) as other:  # another order on the same connection: its own table
                assert np.array_equal(np.sort(_read(other, 0, chunk)[0]), np.arange(9))
            assert [_read(order, e, chunk)[0].tolist() for e in (1, 0, 0)] == [
                w.tolist() for w in whole[::-1] + whole[:1]
            ]
        assert con.sql("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_draw_order%'").fetchall() == [(0,)]
