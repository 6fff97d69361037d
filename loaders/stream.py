"""The mixture the trainer receives: tokens per source of every *training* step, and its ``mixture_error``.

A build's own ``mixture_error`` (:func:`mixing.plan.mixture.shards_mixture_error`) measures its steps as built;
the loader regroups them (``balance.regroup``: :mod:`loaders.planner`), so the stream a trainer reads can
stray further, most where a regrouping window meets a phase boundary. This computes the composition of each
training step from the planner and the shards' segment index only (no token is read), and judges it with
the same metric against the plan's quotas (``plan/quotas.parquet``). World-independent: a training step's
sequences do not depend on the number of ranks.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import polars as pl

from loaders.planner import StepPlanner
from mixing.format.layout import BuildLayout
from mixing.format.manifest import Manifest
from mixing.format.shards import ShardSet
from mixing.plan.mixture import WINDOW, MixtureError, mixture_error, planned_tokens
from mixing.report import StreamMixtureReport

__all__ = ["regroup_settings", "stream_compositions", "stream_mixture_error", "stream_report"]


def regroup_settings(manifest: Manifest) -> tuple[int, int, float]:
    """``(window, period, slack)`` of the mix file's ``balance.regroup`` in a build's manifest (else those of
    :data:`mixing.format.manifest.NO_REGROUP`): what :class:`loaders.PackedDataset` uses by default."""
    regroup = manifest.regrouping
    return regroup.window, regroup.period, regroup.slack


def stream_compositions(planner: StepPlanner) -> np.ndarray:
    """Tokens of each source (the manifest's order) in each training step, int64 [steps, sources]."""
    shards = planner.shards
    offs, segs = shards.segments
    per_seq = np.zeros((len(shards), planner.n_sources), dtype=np.int64)
    np.add.at(per_seq, (np.repeat(np.arange(len(shards)), np.diff(offs)), segs[:, 0]), segs[:, 3])
    out = np.zeros((planner.steps, planner.n_sources), dtype=np.int64)
    for t in range(planner.steps):
        out[t] = per_seq[planner.step_sequences(t)].sum(axis=0)
    return out


def stream_mixture_error(
    shards: ShardSet,
    quotas: pl.DataFrame,
    window: int | None = None,
    period: int | None = None,
    slack: float | None = None,
    seed: int = 0,
    steps: int = WINDOW,
) -> MixtureError:
    """``mixture_error`` of the training steps a :class:`loaders.PackedDataset` with these settings reads
    (default: the manifest's ``regroup``), against the plan's ``quotas`` (a ``plan_quotas`` frame)."""
    w, p, s = regroup_settings(shards.manifest)
    planner = StepPlanner(
        shards,
        w if window is None else window,
        seed,
        p if period is None else period,
        shards.manifest.micro_batches,
        s if slack is None else slack,
    )
    sources, phases, phase, planned = planned_tokens(quotas)
    col = {name: k for k, name in enumerate(sources)}
    remap = np.array([col[name] for name in shards.manifest.sources or ()], dtype=np.int64)
    realized = np.zeros_like(planned)
    comps = stream_compositions(planner)
    for k in range(comps.shape[1]):
        realized[: len(comps), remap[k]] += comps[:, k]
    return mixture_error(realized, planned, phase, sources, phases, steps)


def stream_report(root: str | Path) -> StreamMixtureReport:
    """``mixture_error`` of the trainer's stream of the finished build at ``root`` under its mix file's
    ``balance.regroup`` (what ``weir inspect``, the build summary and the Dagster check show beside the
    build's own): the figures of :func:`mixing.report.inspect_build`'s ``mixture_error`` plus ``regroup``
    (the window, period and slack it was measured with)."""
    layout = BuildLayout(Path(root))
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        quotas = con.sql("SELECT step, phase, source, quota FROM plan_quotas").pl()
    shards = ShardSet(layout.shards_dir)
    me = stream_mixture_error(shards, quotas).report()
    return StreamMixtureReport(**dict(me), regroup=shards.manifest.regrouping)
