"""The mixture the trainer receives: tokens per source of every *training* step.

A build's own steps hold the plan's mixture closely (:func:`mixing.plan.mixture.shards_mixture_error`); the
loader regroups them (``balance.regroup``: :mod:`loaders.planner`), so the stream a trainer reads can stray
further, most where a regrouping window meets a phase boundary. This computes the composition of each
training step from the planner and the shards' segment index only (no token is read);
:func:`mixing.plan.mixture.compositions_mixture_error` judges it against the plan's quotas. World-independent:
a training step's sequences do not depend on the number of ranks.
"""

from __future__ import annotations

import numpy as np

from contract.shards import ShardSet
from loaders.config import Balance, BalanceSettings
from loaders.planner import StepPlanner

__all__ = ["settings_planner", "stream_compositions", "stream_planner"]


def stream_planner(shards: ShardSet, balance: Balance = Balance()) -> StepPlanner:
    """The training steps a :class:`loaders.PackedDataset` over ``shards`` with this ``balance`` reads (each
    unset value the build's, :meth:`loaders.config.Balance.resolve`)."""
    return settings_planner(shards, balance.resolve(shards.manifest))


def settings_planner(shards: ShardSet, b: BalanceSettings) -> StepPlanner:
    """The planner of ``shards`` under resolved balance settings ``b`` (what a dataset reads with)."""
    return StepPlanner(
        shards, b.window, b.seed, b.period, b.micro_batches, b.slack, edge_windows=b.edges, layout=b.layout
    )


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
