"""Checks of a written plan, independent of how it was computed (the plan asset's checks run these).

- ``mixture_error`` of ``plan_units`` against ``plan_quotas`` within the docs/design.md goals;
- every planned unit exists: its document is in ``documents`` and ``start + length ≤ n_tokens``;
- no unit is drawn twice within an epoch of its source;
- the token budget is met per phase and source: tokens drawn ≥ tokens planned − held − S (what the phase
  leaves to later ones: ``plan_quotas.held``; one unit of slack, since the unit that straddles two phases
  counts for the earlier one).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from mixing.plan.mixture import MixtureError, plan_mixture_error

__all__ = ["PlanAudit", "audit_plan"]


@dataclass(frozen=True)
class PlanAudit:
    """``missing_units``: planned units with no such document piece; ``duplicate_units``: units drawn more
    than once in an epoch; ``budget``: phase, source, tokens_planned, tokens_drawn, short (tokens missing
    beyond the one-unit slack, ≥ 0)."""

    mixture: MixtureError
    missing_units: int
    duplicate_units: int
    budget: pl.DataFrame

    @property
    def budget_met(self) -> bool:
        return bool((self.budget["short"] == 0).all())


def audit_plan(db_path: Path, seq_len: int) -> PlanAudit:
    """Run every check on the plan tables in ``db_path`` (read-only)."""
    mixture = plan_mixture_error(db_path)
    with duckdb.connect(str(db_path), read_only=True) as con:
        missing = con.sql(
            """
            SELECT count(*) FROM plan_units u LEFT JOIN documents d USING (source, doc_id)
            WHERE d.n_tokens IS NULL OR u.start < 0 OR u.length < 1 OR u.start + u.length > d.n_tokens
            """
        ).fetchall()[0][0]
        dup = con.sql("SELECT count(*) - count(DISTINCT (source, epoch, doc_id, piece)) FROM plan_units").fetchall()[0][
            0
        ]
        cols = {r[0] for r in con.sql("DESCRIBE plan_quotas").fetchall()}
        held = "held" if "held" in cols else "0"  # a plan made before phases held documents back
        budget = con.sql(
            f"""
            WITH q AS (SELECT phase, source, sum(quota - {held})::BIGINT AS tokens_planned FROM plan_quotas
                       GROUP BY 1, 2),
                 u AS (SELECT phase, source, sum(length)::BIGINT AS tokens_drawn FROM plan_units GROUP BY 1, 2)
            SELECT q.phase, q.source, q.tokens_planned, coalesce(u.tokens_drawn, 0)::BIGINT AS tokens_drawn,
                   greatest(0, q.tokens_planned - $seq - coalesce(u.tokens_drawn, 0))::BIGINT AS short
            FROM q LEFT JOIN u USING (phase, source)
            ORDER BY (SELECT min(step) FROM plan_quotas p WHERE p.phase = q.phase), q.source
            """,
            params={"seq": seq_len},
        ).pl()
    return PlanAudit(mixture, int(missing), int(dup), budget)
