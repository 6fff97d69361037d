"""Length statistics of tokenized documents, computed in DuckDB.

Tables written to the build's DuckDB file (and returned as polars frames):

- ``documents``: every document's metadata (``source``, ``doc_id``, ``file``, ``line``, ``n_tokens``, ...).
- ``length_summary``: per source and ``'*'`` overall: ``docs``, ``tokens``, ``mean``, exact ``min``/``p50``/
  ``p90``/``p99``/``max`` of ``n_tokens``, ``share_over_seq`` (fraction of documents longer than the sequence
  length S) and ``token_share_over_seq`` (fraction of tokens in such documents).
- ``length_histogram``: per source and ``'*'``, log2 buckets ``[lo, hi)`` of ``n_tokens`` with ``docs`` and
  ``tokens``.

Both are also written as parquet under the build's ``plan/`` folder by :func:`mixing.stages.length_stats`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

__all__ = ["LengthStats", "compute_length_stats", "length_tables", "read_length_stats"]


@dataclass(frozen=True)
class LengthStats:
    summary: pl.DataFrame
    histogram: pl.DataFrame


def compute_length_stats(
    db_path: Path, doc_files: dict[str, Path], seq_len: int, config: Mapping[str, str | int] | None = None
) -> LengthStats:
    """(Re)create the three tables from each source's ``docs.parquet`` in ``doc_files``; deterministic.
    ``config``: DuckDB settings (:func:`mixing.plan.database.duckdb_config`); past ``memory_limit`` it spills."""
    files = [str(doc_files[k]) for k in sorted(doc_files)]
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with duckdb.connect(str(db_path), config=dict(config or {})) as con:
        con.execute(
            "CREATE OR REPLACE TABLE documents AS SELECT * FROM read_parquet(?, union_by_name=true)"
            " ORDER BY source, doc_id",
            [files],
        )
        return length_tables(con, seq_len)


def length_tables(con: duckdb.DuckDBPyConnection, seq_len: int) -> LengthStats:
    """(Re)create ``length_summary`` and ``length_histogram`` from the ``documents`` table of ``con``.

    Quantiles are exact (``quantile_disc``: an actual document length). Histogram buckets are powers of
    two, ``[lo, hi)`` with ``hi = 2·lo``, per source and for ``'*'`` (all sources); empty buckets are absent.
    """
    # From the count of documents per (source, length), not from the documents: a grouped count spills to
    # disk past DuckDB's memory_limit where quantile_disc over a billion lengths would not; it has as many
    # rows as distinct lengths. A quantile q is the smallest length with at least q of the documents at or
    # below it (what quantile_disc gives).
    con.execute(
        """
        CREATE OR REPLACE TABLE length_summary AS
        WITH h AS (SELECT source, n_tokens, count(*)::BIGINT AS c FROM documents GROUP BY ALL),
        hh AS (FROM h UNION ALL SELECT NULL, n_tokens, sum(c)::BIGINT FROM h GROUP BY n_tokens),
        cum AS (
            SELECT *, sum(c) OVER (PARTITION BY source ORDER BY n_tokens) AS upto,
                      sum(c) OVER (PARTITION BY source) AS n
            FROM hh
        )
        SELECT coalesce(source, '*') AS source,
               sum(c)::BIGINT AS docs,
               sum(c * n_tokens)::BIGINT AS tokens,
               (sum(c * n_tokens)::HUGEINT / sum(c))::DOUBLE AS mean,
               min(n_tokens)::BIGINT AS min,
               min(n_tokens) FILTER (WHERE upto >= 0.5 * n)::BIGINT AS p50,
               min(n_tokens) FILTER (WHERE upto >= 0.9 * n)::BIGINT AS p90,
               min(n_tokens) FILTER (WHERE upto >= 0.99 * n)::BIGINT AS p99,
               max(n_tokens)::BIGINT AS max,
               (coalesce(sum(c) FILTER (WHERE n_tokens > $seq), 0) / sum(c))::DOUBLE AS share_over_seq,
               (coalesce(sum(c * n_tokens) FILTER (WHERE n_tokens > $seq), 0) / sum(c * n_tokens))::DOUBLE
                   AS token_share_over_seq
        FROM cum GROUP BY source ORDER BY source
        """,
        {"seq": seq_len},
    )
    con.execute(
        """
        CREATE OR REPLACE TABLE length_histogram AS
        WITH b AS (SELECT source, n_tokens, floor(log2(greatest(n_tokens, 1)))::INT AS k FROM documents)
        SELECT coalesce(source, '*') AS source,
               (1::BIGINT << k) AS lo,
               (1::BIGINT << (k + 1)) AS hi,
               count(*)::BIGINT AS docs,
               sum(n_tokens)::BIGINT AS tokens
        FROM b GROUP BY GROUPING SETS ((source, k), (k)) ORDER BY source, lo
        """
    )
    return read_length_stats(con)


def read_length_stats(con: duckdb.DuckDBPyConnection) -> LengthStats:
    """The two length tables of ``con`` as polars frames (ordered by source, then bucket)."""
    summary = con.sql("SELECT * FROM length_summary ORDER BY source").pl()
    histogram = con.sql("SELECT * FROM length_histogram ORDER BY source, lo").pl()
    return LengthStats(summary, histogram)
