"""Each step's token quota per source (``plan_quotas``): the ramped mixture's share of a step's tokens, rounded
so that no error accumulates, and what of it the plan holds back (the fit: :mod:`mixing.plan.fit`).
Deterministic; computed from the mix alone.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from mixing.mixfile.mix import Mix
from mixing.plan.curriculum import Held, PhaseDemand, StepShares, phase_demand, step_shares

__all__ = ["step_quotas"]


def step_quotas(mix: Mix, held: Held | None = None) -> pl.DataFrame:
    """Per step and source: ``quota`` tokens from the ramped mixture × S × global_batch (int64), and ``held``
    (int64, ≤ ``quota``): the tokens of that quota the draw leaves out (``held`` per step and source, see
    :func:`mixing.plan.curriculum_plan.make_plan`; 0 without it).

    Cumulative quotas are rounded, so Σ quota over any prefix of steps is within 0.5 token of ideal, and a
    phase's quotas of a source sum to exactly what :func:`~mixing.plan.curriculum.phase_demand` says the phase
    asks of it (each phase's cumulative quotas start from its boundary there: float rounding never carries
    across phases). A step's ``held`` is what ``held`` names for it, or less where its quota is smaller: the
    rest is held from the phase's steps before it (never from an earlier phase), so each phase holds the sum
    it was asked to unless that is more than its demand.
    """
    sch = step_shares(mix)
    cum = _cumulative(mix, phase_demand(mix))
    drawn = _held_back(cum, held, sch) if held else cum
    zero = np.zeros((1, len(sch.sources)), np.int64)
    quota = np.diff(cum, axis=0, prepend=zero)
    n = len(sch.phase)
    names = np.array([s.name for s in sch.spans])
    return pl.DataFrame(
        {
            "step": np.repeat(np.arange(n, dtype=np.int64), len(sch.sources)),
            "phase": np.repeat(names[sch.phase] if n else np.array([], str), len(sch.sources)),
            "source": np.tile(np.array(sch.sources), n),
            "quota": quota.reshape(-1),
            "cum_quota": cum.reshape(-1),
            "share": sch.shares.reshape(-1),
            "held": (quota - np.diff(drawn, axis=0, prepend=zero)).reshape(-1),
        }
    )


def _held_back(cum: np.ndarray, held: Held, sch: StepShares) -> np.ndarray:
    """``cum`` (int64 [steps, sources], cumulative quotas) less ``held`` from each held step on, kept
    non-decreasing within each phase (a step holding more than its quota holds the rest at the phase's steps
    before it) and never below the phase's start: each step's units keep their steps but for the held ones."""
    col = {name: i for i, name in enumerate(sch.sources)}
    at = np.zeros_like(cum)
    for (step, source), tokens in held.items():
        at[step, col[source]] += tokens
    drawn = np.empty_like(cum)
    before = np.zeros(len(col), np.int64)  # drawn through the previous phase
    for sp in sch.spans:
        if not sp.steps:
            continue
        rows = slice(sp.first_step, sp.end_step)
        start = cum[sp.first_step - 1] if sp.first_step else 0
        own = cum[rows] - start - np.cumsum(at[rows], axis=0)  # the phase's own tokens drawn through each step
        drawn[rows] = before + np.maximum(np.minimum.accumulate(own[::-1], axis=0)[::-1], 0)
        before = drawn[sp.end_step - 1]
    return drawn


def _cumulative(mix: Mix, demand: PhaseDemand) -> np.ndarray:
    """int64 [steps, sources]: each source's cumulative tokens through each step, ``demand``'s per phase."""
    sch = step_shares(mix)
    cap = mix.sequence.length * mix.sequence.global_batch
    cum = np.empty((len(sch.phase), len(sch.sources)), np.int64)
    for p, sp in enumerate(sch.spans):
        rows = slice(sp.first_step, sp.end_step)
        local = np.floor(demand.rest[p] + np.cumsum(sch.shares[rows] * cap, axis=0) + 0.5).astype(np.int64)
        block = np.clip(demand.cum[p] + local, demand.cum[p], demand.cum[p + 1])  # within the phase's own tokens
        block[-1] = demand.cum[p + 1]
        cum[rows] = block
    return cum
