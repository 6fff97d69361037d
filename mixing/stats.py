"""Length statistics of tokenized documents, computed in DuckDB.

Tables written to the build's DuckDB file (and returned as polars frames):

- ``documents``: every document's metadata (``source``, ``doc_id``, ``file``, ``line``, ``n_tokens``, ...).
- ``length_summary``: per source and ``'*'`` overall: ``docs``, ``tokens``, exact ``p50``/``p90``/``p99``/
  ``max`` of ``n_tokens``, and ``share_over_seq`` (fraction of documents longer than the sequence length).
- ``length_histogram``: per source, log2 buckets ``[lo, hi)`` of ``n_tokens`` with ``docs`` and ``tokens``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

__all__ = ["LengthStats", "compute_length_stats"]


@dataclass(frozen=True)
class LengthStats:
    summary: pl.DataFrame
    histogram: pl.DataFrame


def compute_length_stats(db_path: Path, doc_files: dict[str, Path], seq_len: int) -> LengthStats:
    """(Re)create the three tables from each source's ``docs.parquet`` in ``doc_files``; deterministic."""
    files = [str(doc_files[k]) for k in sorted(doc_files)]
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with duckdb.connect(str(db_path)) as con:
        con.execute(
            "CREATE OR REPLACE TABLE documents AS SELECT * FROM read_parquet(?, union_by_name=true)"
            " ORDER BY source, doc_id",
            [files],
        )
        con.execute(
            """
            CREATE OR REPLACE TABLE length_summary AS
            SELECT coalesce(source, '*') AS source,
                   count(*)::BIGINT AS docs,
                   sum(n_tokens)::BIGINT AS tokens,
                   quantile_disc(n_tokens, 0.5)::BIGINT AS p50,
                   quantile_disc(n_tokens, 0.9)::BIGINT AS p90,
                   quantile_disc(n_tokens, 0.99)::BIGINT AS p99,
                   max(n_tokens)::BIGINT AS max,
                   avg((n_tokens > $seq)::INT)::DOUBLE AS share_over_seq
            FROM documents GROUP BY ROLLUP (source) ORDER BY source
            """,
            {"seq": seq_len},
        )
        con.execute(
            """
            CREATE OR REPLACE TABLE length_histogram AS
            SELECT source,
                   (1::BIGINT << floor(log2(n_tokens))::INT) AS lo,
                   (1::BIGINT << (floor(log2(n_tokens))::INT + 1)) AS hi,
                   count(*)::BIGINT AS docs,
                   sum(n_tokens)::BIGINT AS tokens
            FROM documents GROUP BY ALL ORDER BY source, lo
            """
        )
        summary = con.sql("SELECT * FROM length_summary ORDER BY source").pl()
        histogram = con.sql("SELECT * FROM length_histogram ORDER BY source, lo").pl()
    return LengthStats(summary, histogram)
