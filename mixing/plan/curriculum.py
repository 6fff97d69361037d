"""The curriculum over steps: which phase each step is in, and each source's planned share at that step.

Phases follow each other in mix-file order; a phase's ``transition`` ramps from the previous phase's
mixture to its own over its first ``transition.steps`` steps (``linear`` or ``cosine``, sampled at each
step's midpoint); from step ``first_step + transition.steps`` on the phase's own mixture holds exactly.
What each phase asks of each source (:func:`phase_demand`) follows from each phase's mixture, length and ramp
alone, without an array per step (exact fractions). Pure numpy; deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from mixing.mixfile.mix import Mix

__all__ = [
    "Held",
    "PhaseDemand",
    "PhaseSpan",
    "StepShares",
    "length_segments",
    "phase_demand",
    "phase_spans",
    "ramp",
    "step_shares",
]


@dataclass(frozen=True)
class PhaseSpan:
    """Phase ``name`` covers steps ``[first_step, first_step + steps)``; ``ramp_steps`` of them ramp in."""

    name: str
    first_step: int
    steps: int
    ramp_steps: int
    shape: str
    max_doc_tokens: int | None

    @property
    def end_step(self) -> int:
        return self.first_step + self.steps


@dataclass(frozen=True)
class StepShares:
    """``sources`` sorted by name; ``phase`` int64 [n_steps] (index into ``spans``); ``shares`` float64
    [n_steps, n_sources], each row summing to 1."""

    sources: tuple[str, ...]
    spans: tuple[PhaseSpan, ...]
    phase: np.ndarray
    shares: np.ndarray


def phase_spans(mix: Mix) -> tuple[PhaseSpan, ...]:
    """Each phase's resolved first step, length, ramp and length limit, in curriculum order."""
    out, first = [], 0
    for ph, n in zip(mix.curriculum, mix.phase_steps, strict=True):
        tr = ph.transition
        ramp_steps = tr.steps if tr is not None else 0
        shape = tr.shape if tr is not None else "step"
        out.append(PhaseSpan(ph.phase, first, n, ramp_steps, shape, ph.max_doc_tokens))
        first += n
    return tuple(out)


def length_segments(spans: tuple[PhaseSpan, ...]) -> list[list[PhaseSpan]]:
    """Runs of consecutive phases with the same ``max_doc_tokens`` (each drawn in one pass)."""
    segments: list[list[PhaseSpan]] = []
    for sp in spans:
        if segments and segments[-1][-1].max_doc_tokens == sp.max_doc_tokens:
            segments[-1].append(sp)
        else:
            segments.append([sp])
    return segments


def ramp(shape: str, n: int) -> np.ndarray:
    """Weights of the new mixture over the ``n`` ramp steps, float64 [n], strictly inside (0, 1).

    Step ``k`` samples the ramp at ``x = (k + 0.5) / n``: linear ``x``, cosine ``(1 − cos πx) / 2``.
    """
    x = (np.arange(n, dtype=np.float64) + 0.5) / max(n, 1)
    if shape == "linear":
        return x
    if shape == "cosine":
        return (1.0 - np.cos(math.pi * x)) / 2.0
    return np.ones(n)


def step_shares(mix: Mix) -> StepShares:
    """Planned share of every source at every step (ramps included)."""
    names = tuple(sorted(mix.sources))
    spans = phase_spans(mix)
    rows = []
    prev: np.ndarray | None = None
    for ph, span in zip(mix.curriculum, spans, strict=True):
        target = np.array([ph.shares.get(s, 0.0) for s in names], dtype=np.float64)
        block = np.tile(target, (span.steps, 1))
        if prev is not None and span.ramp_steps:
            a = ramp(span.shape, span.ramp_steps)[:, None]
            block[: span.ramp_steps] = (1 - a) * prev + a * target
        rows.append(block)
        prev = target
    shares = np.concatenate(rows) if rows else np.zeros((0, len(names)))
    phase = np.repeat(np.arange(len(spans), dtype=np.int64), [s.steps for s in spans])
    return StepShares(names, spans, phase, shares)


@dataclass(frozen=True)
class PhaseDemand:
    """The tokens the curriculum asks of each source, phase by phase.

    ``sources`` sorted by name; ``spans`` as :func:`phase_spans`; ``cum`` int64 [n_phases + 1, n_sources]: the
    ideal cumulative tokens of each source (Σ share × S × global_batch over the steps, ramps included) at each
    phase boundary, rounded half up (row 0 zeros, row p + 1 through phase p); ``rest`` float64 of the same shape:
    that ideal minus ``cum``, in [−0.5, 0.5).
    """

    sources: tuple[str, ...]
    spans: tuple[PhaseSpan, ...]
    cum: np.ndarray
    rest: np.ndarray

    def tokens(self) -> dict[tuple[str, str], int]:
        """(phase, source) → the tokens the phase asks of the source, 0 included: what the phase's quotas of the
        source sum to (``plan_quotas``)."""
        per_phase = np.diff(self.cum, axis=0)
        return {
            (sp.name, s): int(per_phase[p, i]) for p, sp in enumerate(self.spans) for i, s in enumerate(self.sources)
        }


Held = Mapping[tuple[int, str], int]  # (step, source) → tokens that step draws fewer of (mixing.plan.fit)


def phase_demand(mix: Mix) -> PhaseDemand:
    """What each phase asks of each source, from each phase's mixture, length and ramp alone, in exact arithmetic:
    O(phases × sources) time and memory, whatever the number of steps (the plan is judged feasible or not on it
    before any per-step array is made).

    The sum is :func:`step_shares`' over the phase's steps: a linear or cosine ramp's weights, sampled at the
    steps' midpoints, sum to half its steps (the cosine's ``cos πx`` terms cancel in pairs), so over a ramp of
    ``r`` steps from share ``a`` to share ``b`` a source is asked ``r·(a + b)/2`` steps' worth of tokens, then
    ``b`` of each of the phase's other steps.
    """
    names = tuple(sorted(mix.sources))
    spans = phase_spans(mix)
    cap = mix.sequence.length * mix.sequence.global_batch
    ideal = [Fraction(0)] * len(names)
    cum, rest = [[0] * len(names)], [[0.0] * len(names)]
    prev: list[Fraction] | None = None
    for ph, span in zip(mix.curriculum, spans, strict=True):
        target = [Fraction(ph.shares.get(s, 0.0)) for s in names]
        r = span.ramp_steps if prev is not None else 0
        weight = Fraction(r, 2) if span.shape in ("linear", "cosine") else Fraction(r)  # Σ ramp(shape, r)
        for i, t in enumerate(target):
            ramped = weight * t + (r - weight) * prev[i] if prev is not None and r else Fraction(0)
            ideal[i] += cap * ((span.steps - r) * t + ramped)
        rounded = [math.floor(x + Fraction(1, 2)) for x in ideal]
        cum.append(rounded)
        rest.append([float(x - n) for x, n in zip(ideal, rounded, strict=True)])
        prev = target
    return PhaseDemand(names, spans, np.array(cum, np.int64), np.array(rest, np.float64))
