"""The curriculum over steps: which phase each step is in, and each source's planned share at that step.

Phases follow each other in mix-file order; a phase's ``transition`` ramps from the previous phase's
mixture to its own over its first ``transition.steps`` steps (``linear`` or ``cosine``, sampled at each
step's midpoint); from step ``first_step + transition.steps`` on the phase's own mixture holds exactly.
Pure numpy; deterministic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mixing.mixfile.mix import Mix

__all__ = ["PhaseSpan", "StepShares", "length_segments", "phase_spans", "ramp", "step_shares"]


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
