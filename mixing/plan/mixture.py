"""``mixture_error``: how far realized token shares stray from the planned ones (docs/design.md's metric).

For each source, its share of the tokens over a span of steps, realized versus planned; the error is the
largest absolute difference over every source and every window of ``WINDOW`` consecutive steps (goal
≤ 0.01), and separately over every whole phase (goal ≤ 0.002). Shares are token-weighted over the span
(Σ tokens of the source ÷ Σ tokens of all sources), so a window is judged as the trainer sees it.

Tokens come in whole units (a sequence of the shards, a document of the plan) that a span holds or not:
where one unit is a large share of a window (small global batches: 4 sequences of 8192 tokens a step make
a 10-step window of 40 sequences, one of them 0.025 of it), a layout of whole units cannot promise 0.01.
``unit_window`` is that share (the largest unit's tokens ÷ the fewest planned tokens of a window),
``unit_phase`` the same of the smallest phase, and each goal that applies is the larger of docs/design.md's
and that share (:func:`unit_goal`), which the reports state where it decides (:func:`goal_text`).

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

from contract.shards import ShardSet

__all__ = [
    "GOAL_PHASE",
    "GOAL_WINDOW",
    "WINDOW",
    "MixtureError",
    "MixtureReport",
    "WorstPhase",
    "WorstWindow",
    "compositions_mixture_error",
    "goal_text",
    "largest_sequence",
    "mixture_error",
    "plan_mixture_error",
    "planned_tokens",
    "shards_mixture_error",
    "unit_goal",
    "window_errors",
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
    unit_window: float = 0.0  # the largest unit's share of a window: the window error whole units allow
    unit_phase: float = 0.0  # the same of the smallest phase

    @property
    def goal_window(self) -> float:
        """The window goal that applies (:func:`unit_goal`)."""
        return unit_goal(GOAL_WINDOW, self.unit_window)

    @property
    def goal_phase(self) -> float:
        """The phase goal that applies (:func:`unit_goal`)."""
        return unit_goal(GOAL_PHASE, self.unit_phase)

    @property
    def ok(self) -> bool:
        """Both within the docs/design.md goals, or where whole units allow no less, within what they allow."""
        return self.window <= self.goal_window and self.phase <= self.goal_phase

    def report(self) -> MixtureReport:
        """The figures as ``weir inspect`` shows them: the metric, the goals that apply (``unit_window`` and
        ``unit_phase``: the share of one whole unit, where it exceeds docs/design.md's goal), where it is worst."""
        return MixtureReport(
            window=self.window,
            phase=self.phase,
            window_steps=WINDOW,
            goal_window=self.goal_window,
            goal_phase=self.goal_phase,
            unit_window=self.unit_window,
            unit_phase=self.unit_phase,
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
    metric), ``window_steps`` (the window's length), the goals that apply ``goal_window`` and ``goal_phase``
    (docs/design.md's, or where more, ``unit_window`` / ``unit_phase``: the share of one whole unit of a window /
    of the smallest phase, 0 in reports written before they existed: :func:`unit_goal`), ``ok`` (both met),
    where each is worst, and ``per_phase`` (phase → its error)."""

    window: float
    phase: float
    window_steps: int
    goal_window: float
    goal_phase: float
    unit_window: float = 0.0
    unit_phase: float = 0.0
    ok: bool
    worst_window: WorstWindow
    worst_phase: WorstPhase
    per_phase: dict[str, float]


def unit_goal(goal: float, unit: float) -> float:
    """The goal that applies where one whole unit is ``unit`` of the span: docs/design.md's ``goal``, or
    ``unit`` where it is more (no layout of whole units can do better; the share is computed the way the
    metric is, so that a layout exactly one unit off meets it)."""
    return max(float(goal), float(unit) * (1 + 1e-9))


def goal_text(goal: float, unit: float, value: float, span: str, what: str = "sequence") -> str:
    """How reports state a goal beside a figure ``value``: ``≤ 0.01`` where it is met or whole units are
    finer; else the share one whole unit (``what``: sequence, document) is of ``span``, which is then the
    goal that applies (:func:`unit_goal`)."""
    if value <= goal or unit <= goal:
        return f"≤ {goal}"
    return f"≤ {unit:.4f}: one whole {what} is that share of {span}, more than {goal}"


def _share_error(realized: np.ndarray, planned: np.ndarray) -> np.ndarray:
    """|realized share − planned share| per row and source; rows with no tokens on a side count as 0."""
    r_tot = realized.sum(axis=1, keepdims=True)
    p_tot = planned.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        err = np.abs(realized / r_tot - planned / p_tot)
    return np.nan_to_num(err, nan=0.0)


def window_errors(realized: np.ndarray, planned: np.ndarray, window: int = WINDOW) -> np.ndarray:
    """float64 [n_steps − window + 1, n_sources]: |realized share − planned share| of each source in each window
    of ``window`` consecutive steps (row ``i``: steps ``i … i + window − 1``); arguments as :func:`mixture_error`'s,
    ``window`` ≤ n_steps."""
    realized = np.asarray(realized, dtype=np.float64)
    planned = np.asarray(planned, dtype=np.float64)
    zero = np.zeros((1, realized.shape[1]))
    r_cum = np.concatenate([zero, np.cumsum(realized, axis=0)])
    p_cum = np.concatenate([zero, np.cumsum(planned, axis=0)])
    return _share_error(r_cum[window:] - r_cum[:-window], p_cum[window:] - p_cum[:-window])


def mixture_error(
    realized: np.ndarray,
    planned: np.ndarray,
    phase: np.ndarray,
    sources: tuple[str, ...] | list[str],
    phase_names: tuple[str, ...] | list[str],
    window: int = WINDOW,
    unit: float = 0.0,
) -> MixtureError:
    """The metric from tokens per step and source.

    ``realized`` and ``planned`` are [n_steps, n_sources] token counts (any numeric dtype); ``phase`` is
    int [n_steps], an index into ``phase_names``. With fewer than ``window`` steps the one window is all
    steps. ``unit``: tokens of the largest whole unit (sequence or document), for ``unit_window`` and
    ``unit_phase``.
    """
    realized = np.asarray(realized, dtype=np.float64)
    planned = np.asarray(planned, dtype=np.float64)
    n = realized.shape[0]
    if n == 0:
        return MixtureError(0.0, 0.0, (0, ""), ("", ""), {})
    w = min(window, n)
    win = window_errors(realized, planned, w)
    p_cum = np.concatenate([np.zeros((1, planned.shape[1])), np.cumsum(planned, axis=0)])
    fewest = float((p_cum[w:] - p_cum[:-w]).sum(axis=1).min())
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
    smallest = min(
        (float(planned[phase == k].sum()) for k in range(len(phase_names)) if (phase == k).any()), default=0.0
    )
    return MixtureError(
        float(win[i, s]),
        max(worst, 0.0),
        (int(i), sources[int(s)]),
        worst_phase,
        per_phase,
        unit / fewest if fewest > 0 else 0.0,
        unit / smallest if smallest > 0 else 0.0,
    )


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
        unit = con.sql("SELECT coalesce(max(length), 0) FROM plan_units").fetchall()[0][0]
    sources, phases, phase, planned = planned_tokens(quotas)
    realized = np.zeros_like(planned)
    col = {s: k for k, s in enumerate(sources)}
    first = int(quotas["step"].min()) if quotas.height else 0  # a continuation plans from its switch step on
    realized[drawn["step"].to_numpy() - first, [col[s] for s in drawn["source"].to_list()]] = drawn["tokens"].to_numpy()
    return mixture_error(realized, planned, phase, sources, phases, window, float(unit))


def shards_mixture_error(shards: ShardSet, quotas: pl.DataFrame, window: int = WINDOW) -> MixtureError:
    """The metric of packed shards: tokens of each sequence's segments per step vs the plan's ``quotas``
    (a ``plan_quotas`` frame, e.g. the build's ``plan/quotas.parquet``)."""
    sources = list(shards.manifest.sources or ())
    offs, segs = shards.segments  # all sequences at once: one pass over the shards' metadata
    steps = np.zeros((int(shards.steps.max()) + 1 if len(shards) else 0, len(sources)), dtype=np.int64)
    np.add.at(steps, (np.repeat(shards.steps, np.diff(offs)), segs[:, 0]), segs[:, 3])
    return compositions_mixture_error(steps, sources, quotas, window, largest_sequence(shards))


def compositions_mixture_error(
    compositions: np.ndarray,
    sources: Sequence[str],
    quotas: pl.DataFrame,
    window: int = WINDOW,
    unit: float = 0.0,
) -> MixtureError:
    """The metric of a stream of steps given as tokens per source, against the plan's ``quotas`` (a
    ``plan_quotas`` frame): ``compositions`` int [steps, len(sources)], row t the t-th step, columns named by
    ``sources`` (e.g. a manifest's order; each a source of the plan). Planned steps past its last row count
    as empty. Integer counts, so the figures do not depend on how the stream was summed. ``unit``: tokens of
    the largest whole sequence (:func:`largest_sequence`), as :func:`mixture_error`'s."""
    names, phases, phase, planned = planned_tokens(quotas)
    col = {s: k for k, s in enumerate(names)}
    realized = np.zeros_like(planned)
    for k, name in enumerate(sources):
        realized[: len(compositions), col[name]] += compositions[:, k]
    return mixture_error(realized, planned, phase, names, phases, window, unit)


def largest_sequence(shards: ShardSet) -> float:
    """Real tokens of the shards' fullest sequence (the ``unit`` of :func:`mixture_error`)."""
    offs, segs = shards.segments
    tokens = np.bincount(np.repeat(np.arange(len(offs) - 1), np.diff(offs)), weights=segs[:, 3])
    return float(tokens.max()) if len(tokens) else 0.0
