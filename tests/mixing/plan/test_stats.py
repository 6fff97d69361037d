"""Length statistics in DuckDB against an independent numpy computation."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixing.plan.stats import length_tables

SEQ = 64


@settings(max_examples=40)
@given(
    st.dictionaries(
        st.sampled_from(["a", "b", "c"]),
        st.lists(st.integers(1, 5000), min_size=1, max_size=300),
        min_size=1,
    )
)
def test_length_stats_match_numpy(docs: dict[str, list[int]]) -> None:
    src = [k for k, v in docs.items() for _ in v]
    lens = np.array([x for v in docs.values() for x in v], dtype=np.int64)
    with duckdb.connect() as con:
        con.register("d", pa.table({"source": src, "doc_id": np.arange(len(lens)), "n_tokens": lens}))
        con.execute("CREATE TABLE documents AS SELECT * FROM d")
        st_ = length_tables(con, SEQ)
    groups = {**{k: np.array(v) for k, v in docs.items()}, "*": lens}
    assert sorted(st_.summary["source"].to_list()) == sorted(groups)
    for name, x in groups.items():
        row = st_.summary.filter(pl.col("source") == name).row(0, named=True)
        assert row["docs"] == len(x) and row["tokens"] == x.sum()
        assert row["min"] == x.min() and row["max"] == x.max()
        for q in (50, 90, 99):
            # exact: an actual document length, the smallest with at least q% of documents at or below it
            assert row[f"p{q}"] == np.quantile(x, q / 100, method="inverted_cdf"), (name, q)
        assert row["share_over_seq"] == pytest.approx((x > SEQ).mean())
        assert row["token_share_over_seq"] == pytest.approx(x[x > SEQ].sum() / x.sum())
        h = st_.histogram.filter(pl.col("source") == name)
        assert h["docs"].sum() == len(x) and h["tokens"].sum() == x.sum()
        assert (h["hi"] == 2 * h["lo"]).all()
        for lo, n in zip(h["lo"].to_list(), h["docs"].to_list(), strict=True):
            assert n == ((x >= lo) & (x < 2 * lo)).sum()


def test_stage_writes_tables_and_parquet(demo_build: Path) -> None:
    with duckdb.connect(str(demo_build / "weir.duckdb"), read_only=True) as con:
        summary = con.sql("SELECT * FROM length_summary ORDER BY source").pl()
        docs = con.sql("SELECT count(*) FROM documents").fetchall()[0][0]
    assert summary.filter(pl.col("source") == "*")["docs"][0] == docs
    on_disk = pl.read_parquet(demo_build / "plan" / "length_summary.parquet").sort("source")
    assert on_disk.equals(summary)
    hist = pl.read_parquet(demo_build / "plan" / "length_histogram.parquet")
    assert hist.filter(pl.col("source") == "*")["docs"].sum() == docs


def test_length_stats_of_two_million_documents_fit_in_40_mb_of_duckdb(tmp_path: Path) -> None:
    """The summary comes from counts per length, which DuckDB spills, not from every length held at once
    (``quantile_disc`` over 2M lengths ran out of memory under this limit)."""
    n = 2_000_000
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 100_000, n)
    src = rng.choice(np.array(["a", "b"]), n)
    with duckdb.connect(str(tmp_path / "w.duckdb"), config={"memory_limit": "40MB", "threads": 1}) as con:
        con.register("d", pa.table({"source": src, "doc_id": np.arange(n), "n_tokens": lens}))
        con.execute("CREATE TABLE documents AS SELECT * FROM d")
        con.unregister("d")
        st_ = length_tables(con, SEQ)
    row = st_.summary.filter(pl.col("source") == "*").row(0, named=True)
    assert row["docs"] == n and row["tokens"] == lens.sum()
    assert row["p50"] == np.quantile(lens, 0.5, method="inverted_cdf")
    assert row["p99"] == np.quantile(lens, 0.99, method="inverted_cdf")
