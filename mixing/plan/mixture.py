"""``mixture_error``: how far realized token shares stray from the planned ones (docs/design.md's metric).

For each source, its share of the tokens over a span of steps, realized versus planned; the error is the
largest absolute difference over every source and every window of ``WINDOW`` consecutive steps (goal
≤ 0.01), and separately over every whole phase (goal ≤ 0.002). Shares are token-weighted over the span
(Σ tokens of the source ÷ Σ tokens of all sources), so a window is judged as the trainer sees it.

Works on the plan (``plan_units`` against ``plan_quotas``), on packed shards (their segments against the
same quotas), and on any stream of steps given as tokens per source (:func:`compositions_mixture_error`: the
trainer's, as :mod:`loaders.stream` computes it). Pure numpy plus DuckDB reads; deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict

from mixing.format.shards import ShardSet

__all__ = [
    "GOAL_PHASE",
    "GOAL_WINDOW",
    "WINDOW",
    "MixtureError",
    "MixtureReport",
    "WorstPhase",
    "WorstWindow",
    "compositions_mixture_error",
    "mixture_error",
    "plan_mixture_error",
    "planned_tokens",
    "shards_mixture_error",
]

WINDOW = 10
GOAL_WINDOW = 0.01
GOAL_PHASE = 0.002


@dataclass(frozen=True)
class MixtureError:
    """``window``/``phase``: the metric; ``worst_window`` = (first step, source) and ``worst_phase`` =
    (phase, source) where it is reached; ``per_phase``: phase → its error."""

    window: float
    phase: float
    worst_window: tuple[int, str]
    worst_phase: tuple[str, str]
    per_phase: dict[str, float]

    @property
    def ok(self) -> bool:
        """Both within the docs/design.md goals."""
        return self.window <= GOAL_WINDOW and self.phase <= GOAL_PHASE

    def report(self) -> MixtureReport:
        """The figures as ``weir inspect`` shows them: the metric, its goals, where it is worst."""
        return MixtureReport(
            window=self.window,
            phase=self.phase,
            window_steps=WINDOW,
            goal_window=GOAL_WINDOW,
            goal_phase=GOAL_PHASE,
            ok=self.ok,
            worst_window=WorstWindow(first_step=self.worst_window[0], source=self.worst_window[1]),
            worst_phase=WorstPhase(phase=self.worst_phase[0], source=self.worst_phase[1]),
            per_phase=self.per_phase,
        )


class _Report(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorstWindow(_Report):
    """Where the window error is reached: the window's first step and the source."""

    first_step: int
    source: str


class WorstPhase(_Report):
    """Where the phase error is reached: the phase and the source."""

    phase: str
    source: str


class MixtureReport(_Report):
    """:class:`MixtureError` as reported (``weir inspect``, ``report.json``): ``window`` and ``phase`` (the
    metric), ``window_steps`` (the window's length), the goals ``goal_window`` and ``goal_phase``, ``ok``
    (both met), where each is worst, and ``per_phase`` (phase → its error)."""

    window: float
    phase: float
    window_steps: int
    goal_window: float
    goal_phase: float
    ok: bool
    worst_window: WorstWindow
    worst_phase: WorstPhase
    per_phase: dict[str, float]


def _share_error(realized: np.ndarray, planned: np.ndarray) -> np.ndarray:
    """|realized share − planned share| per row and source; rows with no tokens on a side count as 0."""
    r_tot = realized.sum(axis=1, keepdims=True)
    p_tot = planned.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(realized / r_tot - planned / p_tot)
    return np.nan_to_num(err, nan=0.0)


def mixture_error(
    realized: np.ndarray,
    planned: np.ndarray,
    phase: np.ndarray,
    sources: tuple[str, ...] | list[str],
    phase_names: tuple[str, ...] | list[str],
    window: int = WINDOW,
) -> MixtureError:
    """The metric from tokens per step and source.

    ``realized`` and ``planned`` are [n_steps, n_sources] token counts (any numeric dtype); ``phase`` is
    int [n_steps], an index into ``phase_names``. With fewer than ``window`` steps the one window is all
    steps.
    """
    realized = np.asarray(realized, dtype=np.float64)
    planned = np.asarray(planned, dtype=np.float64)
    n = realized.shape[0]
    if n == 0:
        return MixtureError(0.0, 0.0, (0, ""), ("", ""), {})
    w = min(window, n)
    zero = np.zeros((1, realized.shape[1]))
    r_cum = np.concatenate([zero, np.cumsum(realized, axis=0)])
    p_cum = np.concatenate([zero, np.cumsum(planned, axis=0)])
    win = _share_error(r_cum[w:] - r_cum[:-w], p_cum[w:] - p_cum[:-w])
    i, s = np.unravel_index(int(np.argmax(win)), win.shape)
    per_phase: dict[str, float] = {}
    worst_phase, worst = ("", ""), -1.0
    for k, name in enumerate(phase_names):
        rows = phase == k
        if not rows.any():
            continue
        e = _share_error(realized[rows].sum(axis=0, keepdims=True), planned[rows].sum(axis=0, keepdims=True))[0]
        per_phase[name] = float(e.max())
        if e.max() > worst:
            worst, worst_phase = float(e.max()), (name, sources[int(np.argmax(e))])
    return MixtureError(float(win[i, s]), max(worst, 0.0), (int(i), sources[int(s)]), worst_phase, per_phase)


def planned_tokens(quotas: pl.DataFrame) -> tuple[tuple[str, ...], tuple[str, ...], np.ndarray, np.ndarray]:
    """(sources, phase names in step order, phase index per step, planned tokens [n_steps, n_sources])."""
    sources = tuple(sorted(quotas["source"].unique().to_list()))
    wide = quotas.pivot(on="source", index=["step", "phase"], values="quota").sort("step")
    phases = tuple(dict.fromkeys(wide["phase"].to_list()))
    idx = {p: k for k, p in enumerate(phases)}
    phase = np.array([idx[p] for p in wide["phase"].to_list()], dtype=np.int64)
    return sources, phases, phase, wide.select(sources).to_numpy().astype(np.float64)


def plan_mixture_error(db_path: Path, window: int = WINDOW) -> MixtureError:
    """The metric of the plan in ``db_path``: tokens of ``plan_units`` per step vs ``plan_quotas``."""
    with duckdb.connect(str(db_path), read_only=True) as con:
        quotas = con.sql("SELECT step, phase, source, quota FROM plan_quotas").pl()
        drawn = con.sql("SELECT step, source, sum(length)::BIGINT AS tokens FROM plan_units GROUP BY 1, 2").pl()
    sources, phases, phase, planned = planned_tokens(quotas)
    realized = np.zeros_like(planned)
    col = {s: k for k, s in enumerate(sources)}
    realized[drawn["step"].to_numpy(), [col[s] for s in drawn["source"].to_list()]] = drawn["tokens"].to_numpy()
    return mixture_error(realized, planned, phase, sources, phases, window)


def shards_mixture_error(shards: ShardSet, quotas: pl.DataFrame, window: int = WINDOW) -> MixtureError:
    """The metric of packed shards: tokens of each sequence's segments per step vs the plan's ``quotas``
    (a ``plan_quotas`` frame, e.g. the build's ``plan/quotas.parquet``)."""
    sources = list(shards.manifest.sources or ())
    offs, segs = shards.segments  # all sequences at once: one pass over the shards' metadata
    steps = np.zeros((int(shards.steps.max()) + 1 if len(shards) else 0, len(sources)), dtype=np.int64)
    np.add.at(steps, (np.repeat(shards.steps, np.diff(offs)), segs[:, 0]), segs[:, 3])
    return compositions_mixture_error(steps, sources, quotas, window)


def compositions_mixture_error(
    compositions: np.ndarray, sources: Sequence[str], quotas: pl.DataFrame, window: int = WINDOW
) -> MixtureError:
    """The metric of a stream of steps given as tokens per source, against the plan's ``quotas`` (a
    ``plan_quotas`` frame): ``compositions`` int [steps, len(sources)], row t the t-th step, columns named by
    ``sources`` (e.g. a manifest's order; each a source of the plan). Planned steps past its last row count
    as empty. Integer counts, so the figures do not depend on how the stream was summed."""
    names, phases, phase, planned = planned_tokens(quotas)
    col = {s: k for k, s in enumerate(names)}
    realized = np.zeros_like(planned)
    for k, name in enumerate(sources):
        realized[: len(compositions), col[name]] += compositions[:, k]
    return mixture_error(realized, planned, phase, names, phases, window)
