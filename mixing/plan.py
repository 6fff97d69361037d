"""The curriculum plan: per-step token quotas per source, and which document pieces each step draws.

Documents longer than the sequence length S are cut into S-sized pieces (only those); a *unit* is a whole
document or one such piece. Tables written to the build's DuckDB file:

- ``plan_quotas(step, phase, source, quota, cum_quota)``: tokens of ``source`` planned for ``step``;
  the cumulative quota is the rounded cumulative ideal, so rounding error never accumulates.
- ``plan_units(step, phase, source, doc_id, piece, start, length, epoch, ord)``: the units each step draws,
  in a seeded order per source (a fresh permutation each epoch of that source).

Deterministic for the same documents, mix and seed.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from mixing.errors import WeirError
from mixing.mixfile import Mix

__all__ = ["Plan", "PlanError", "make_plan", "step_quotas"]


class PlanError(WeirError, ValueError):
    """The mix cannot be planned with the documents there are (names phase, source, tokens)."""


@dataclass(frozen=True)
class Plan:
    quotas: pl.DataFrame
    per_source: pl.DataFrame  # source, tokens_planned, tokens_available, epochs
    units: int


def step_quotas(mix: Mix) -> pl.DataFrame:
    """Per step and source: ``quota`` tokens, from each phase's mixture × S × global_batch.

    Cumulative quotas are rounded, so Σ quota over any prefix of steps is within 0.5 token of ideal.
    """
    cap = mix.sequence.length * mix.sequence.global_batch
    names = sorted(mix.sources)
    shares = np.array([[ph.mixture.get(s, 0.0) for s in names] for ph in mix.curriculum for _ in range(ph.steps)])
    phases = [ph.phase for ph in mix.curriculum for _ in range(ph.steps)]
    cum = np.floor(np.cumsum(shares * cap, axis=0) + 0.5).astype(np.int64)
    quota = np.diff(cum, axis=0, prepend=np.zeros((1, len(names)), np.int64))
    n = len(phases)
    return pl.DataFrame(
        {
            "step": np.repeat(np.arange(n, dtype=np.int64), len(names)),
            "phase": np.repeat(np.array(phases), len(names)),
            "source": np.tile(np.array(names), n),
            "quota": quota.reshape(-1),
            "cum_quota": cum.reshape(-1),
        }
    )


def make_plan(mix: Mix, db_path: Path) -> Plan:
    """Write ``plan_quotas`` and ``plan_units`` into ``db_path`` (which must hold ``documents``).

    Raises :class:`PlanError` before writing anything when a source with a positive share has no
    documents or would need more epochs than its ``max_epochs``.
    """
    seq = mix.sequence.length
    quotas = step_quotas(mix)
    need = quotas.group_by("source").agg(pl.col("quota").sum().alias("tokens_planned"))
    with duckdb.connect(str(db_path)) as con:
        have = con.sql(
            "SELECT source, sum(n_tokens)::BIGINT AS tokens, count(*) AS docs FROM documents GROUP BY 1"
        ).pl()
        per_source = need.join(have, on="source", how="left").fill_null(0).sort("source")
        epochs: dict[str, int] = {}
        for row in per_source.iter_rows(named=True):
            name, planned, avail = row["source"], row["tokens_planned"], row["tokens"]
            if planned == 0:
                epochs[name] = 0
                continue
            first_phase = quotas.filter((pl.col("source") == name) & (pl.col("quota") > 0))["phase"][0]
            if avail == 0:
                raise PlanError(
                    f"phase {first_phase!r} needs {planned} tokens of source {name!r}, but it has no documents"
                )
            epochs[name] = -(-planned // avail)
            cap = mix.sources[name].max_epochs
            if epochs[name] > cap:
                mine = quotas.filter(pl.col("source") == name)
                short = mine.filter(pl.col("cum_quota") > cap * avail).row(0, named=True)
                raise PlanError(
                    f"source {name!r} runs out in phase {short['phase']!r} at step {short['step']}: the plan needs "
                    f"{planned} tokens of it ({planned / avail:.2f} epochs) but it has {avail} tokens and "
                    f"max_epochs is {cap:g} ({int(cap * avail)} tokens at most)"
                )
        order = _draw_order(con, mix.seed, epochs)
        con.register("draw_order", order.to_arrow())
        con.register("quotas_in", quotas.to_arrow())
        con.execute("CREATE OR REPLACE TABLE plan_quotas AS SELECT * FROM quotas_in ORDER BY step, source")
        con.execute(
            """
            CREATE OR REPLACE TABLE plan_units AS
            WITH units AS (
                SELECT o.source, o.epoch, o.rank, d.doc_id, p.start,
                       least($seq, d.n_tokens - p.start)::BIGINT AS length,
                       (p.start // $seq)::BIGINT AS piece
                FROM draw_order o JOIN documents d USING (source, doc_id),
                     LATERAL (SELECT unnest(range(0, d.n_tokens, $seq)) AS start) p
            ), ordered AS (
                SELECT *, row_number() OVER w - 1 AS ord,
                       coalesce(sum(length) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0)
                           AS cum_before
                FROM units WINDOW w AS (PARTITION BY source ORDER BY epoch, rank, piece)
            )
            SELECT q.step, q.phase, u.source, u.doc_id, u.piece, u.start, u.length, u.epoch, u.ord
            FROM ordered u ASOF JOIN (FROM quotas_in WHERE quota > 0) q
                ON u.source = q.source AND q.cum_quota > u.cum_before
            ORDER BY q.step, u.source, u.ord
            """,
            {"seq": seq},
        )
        n_units = con.sql("SELECT count(*) FROM plan_units").fetchall()[0][0]
    per_source = per_source.with_columns(
        pl.col("source").replace_strict(epochs, return_dtype=pl.Int64).alias("epochs")
    ).rename({"tokens": "tokens_available"})
    return Plan(quotas, per_source, int(n_units))


def _draw_order(con: duckdb.DuckDBPyConnection, seed: int, epochs: dict[str, int]) -> pl.DataFrame:
    """A seeded permutation of each source's documents per epoch (numpy PCG64: stable across versions)."""
    frames = []
    for name, n_epochs in sorted(epochs.items()):
        ids = con.sql("SELECT doc_id FROM documents WHERE source = ? ORDER BY doc_id", params=[name]).pl()
        doc_ids = ids["doc_id"].to_numpy()
        for e in range(n_epochs):
            rng = np.random.default_rng([seed & 0xFFFFFFFF, zlib.crc32(name.encode()), e])
            frames.append(
                pl.DataFrame(
                    {"source": name, "epoch": e, "doc_id": doc_ids, "rank": rng.permutation(len(doc_ids))},
                    schema={"source": pl.String, "epoch": pl.Int64, "doc_id": pl.Int64, "rank": pl.Int64},
                )
            )
    if not frames:
        return pl.DataFrame(schema={"source": pl.String, "epoch": pl.Int64, "doc_id": pl.Int64, "rank": pl.Int64})
    return pl.concat(frames)
