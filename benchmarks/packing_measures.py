"""The measures ``benchmarks/packing.py`` prints: the B0 baseline (concatenate-and-chunk) and the quality
figures of a packing, each computed from arrays alone (no build, no timing; deterministic).

- :func:`baseline_concat_chunk`, :func:`baseline_mixture`, :func:`_baseline_cost`: B0, the plan's units back to
  back in plan order, cut every S tokens: its packing efficiency and truncated documents, its ``mixture_error``
  against the plan's quotas, its per-sequence cost.
- :func:`packing_figures`: the quality figures ``inspect_build`` reports, from a :class:`Packing` (weir's or the
  reference packer's).
- :func:`drop_figures`: what the phase ends dropped (length percentile, documents a phase never gave, longest
  wait).
- :func:`document_share`: the largest share of one document in the tokens of any window of consecutive steps.
- :func:`_cost_spread`: max/mean and cv of per-sequence costs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from contract.cost import CostModel
from mixing.pack.result import Packing
from mixing.plan.mixture import MixtureError, mixture_error

__all__ = ["baseline_concat_chunk", "baseline_mixture", "document_share", "drop_figures", "packing_figures"]


def baseline_concat_chunk(units: np.ndarray, doc_len: np.ndarray, seq_len: int) -> dict[str, Any]:
    """B0: the plan's units back to back in plan order, cut every S tokens.

    ``units`` int64 [n, 2] = (length, start) per unit, ``doc_len`` the whole document's length.
    """
    ends = np.cumsum(units[:, 0])
    starts = ends - units[:, 0]
    tokens = int(ends[-1])
    n_seq = -(-tokens // seq_len)
    whole = doc_len <= seq_len
    split = whole & (starts // seq_len != (ends - 1) // seq_len)
    n_docs = int((units[:, 1] == 0).sum())  # document occurrences: each has exactly one unit starting at 0
    return {
        "packing_efficiency": tokens / (n_seq * seq_len),
        "truncated_docs": float(split.sum() / n_docs),
        "sequences": n_seq,
        "seq_lens": np.minimum(seq_len, tokens - np.arange(n_seq) * seq_len),
        "cuts": (starts, ends),
    }


def baseline_mixture(
    units: np.ndarray, steps: int, seq_len: int, batch: int, quotas: pl.DataFrame
) -> tuple[float, float]:
    """``mixture_error`` of B0: the plan's units (``units`` int64 [n, 2] = (length, source index) in plan
    order) back to back, step k holding tokens [k·C, (k+1)·C) with C = batch·S, against the plan's
    ``quotas`` (a ``plan_quotas`` frame)."""
    sources = sorted(quotas["source"].unique().to_list())
    ends = np.cumsum(units[:, 0])
    cum = np.zeros((len(units) + 1, len(sources)))  # tokens of each source before unit i
    np.add.at(cum[1:], (np.arange(len(units)), units[:, 1]), units[:, 0])
    cum = np.cumsum(cum, axis=0)
    at = np.minimum(np.arange(steps + 1) * batch * seq_len, ends[-1])  # step boundaries, as token positions
    i = np.searchsorted(ends, at, side="right")  # the unit each boundary falls in
    upto = cum[np.minimum(i, len(units))].copy()
    inside = i < len(units)
    starts = ends - units[:, 0]
    upto[inside, units[i[inside], 1]] += at[inside] - starts[i[inside]]
    realized = np.diff(upto, axis=0)
    wide = quotas.pivot(on="source", index=["step", "phase"], values="quota").sort("step")
    phase_names = list(dict.fromkeys(wide["phase"].to_list()))
    phase = np.array([phase_names.index(p) for p in wide["phase"].to_list()])
    me = mixture_error(realized, wide.select(sources).to_numpy(), phase, sources, phase_names)
    return me.window, me.phase


def _cost_spread(cost: np.ndarray) -> tuple[float, float]:
    m = float(cost.mean())
    return float(cost.max() / m), float(cost.std() / m)


def _baseline_cost(starts: np.ndarray, ends: np.ndarray, seq_len: int, cost: CostModel) -> np.ndarray:
    """Per-sequence cost of B0 (documents cut at sequence edges: each piece costs as its own document)."""
    out = np.zeros(-(-int(ends[-1]) // seq_len))
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        while s < e:
            k = s // seq_len
            piece = min(e, (k + 1) * seq_len) - s
            out[k] += cost.of(piece)
            s += piece
    return out


def packing_figures(p: Packing, quotas: pl.DataFrame, doc_len: dict[str, np.ndarray]) -> dict[str, float]:
    """The quality figures ``inspect_build`` reports, computed from a packing (either implementation's)."""
    n, seq_len = len(p.seq_step), p.seq_len
    split = docs = 0
    for k, name in enumerate(p.sources):
        mine = p.segments[p.segments[:, 0] == k]
        dl = doc_len[name][mine[:, 1]]
        split += len(np.unique(mine[(dl <= seq_len) & (mine[:, 3] < dl), 1]))
        docs += len(np.unique(mine[:, 1]))
    wide = quotas.pivot(on="source", index=["step", "phase"], values="quota").sort("step")
    sources = sorted(quotas["source"].unique().to_list())
    phase_names = list(dict.fromkeys(wide["phase"].to_list()))
    phase = np.array([phase_names.index(x) for x in wide["phase"].to_list()])
    realized = np.zeros((len(wide), len(sources)))
    remap = np.array([sources.index(s) for s in p.sources], np.int64)
    seg_step = np.repeat(p.seq_step, np.diff(p.seg_offsets))
    np.add.at(realized, (seg_step, remap[p.segments[:, 0]]), p.segments[:, 3])
    me: MixtureError = mixture_error(realized, wide.select(sources).to_numpy(), phase, sources, phase_names)
    cmax, ccv = _cost_spread(p.seq_cost)
    return {
        "packing_efficiency": float(p.seq_tokens.sum() / (n * seq_len)),
        "truncated_docs": split / docs if docs else 0.0,
        "sequences": n,
        "tokens_dropped": int(p.dropped[:, 3].sum()),
        "cost_max": cmax,
        "cost_cv": ccv,
        "window": me.window,
        "phase": me.phase,
    }


def drop_figures(p: Packing, plan: dict[str, np.ndarray], phase_of_step: np.ndarray) -> dict[str, float]:
    """What the phase ends dropped: ``pct``, the dropped units' mean length percentile within their source (the
    mid-rank of each length among the source's planned units: ~0.5 when the choice is blind to length, ~0 when
    it takes the shortest); ``lost``, the documents (source, doc_id) planned in a phase that no step of that
    phase delivered; ``first``, the dropped units that start their document (a whole document, each one a
    planned occurrence, one epoch's, that the trainer never sees; or a long one's first piece); ``wait``, the
    most steps any unit was placed after its own (a unit planned again in a later epoch paired with its
    placements in order). ``plan``: int64 columns ``src`` (index into ``p.sources``),
    ``doc_id``, ``start``, ``step``, ``length``, ``phase`` of every planned unit; ``phase_of_step``: each
    step's phase index."""
    pct = np.zeros(len(p.dropped))
    for k in range(len(p.sources)):
        lengths = np.sort(plan["length"][plan["src"] == k])
        mine = p.dropped[:, 0] == k
        if mine.any():
            lo = np.searchsorted(lengths, p.dropped[mine, 3], "left")
            pct[mine] = (lo + np.searchsorted(lengths, p.dropped[mine, 3], "right")) / 2 / len(lengths)
    span = int(max(plan["doc_id"].max(initial=0), p.segments[:, 1].max(initial=0))) + 1
    planned_key = plan["src"] * span + plan["doc_id"]
    seg_phase = phase_of_step[np.repeat(p.seq_step, np.diff(p.seg_offsets))]
    seg_key = p.segments[:, 0] * span + p.segments[:, 1]
    lost = sum(
        len(np.setdiff1d(planned_key[plan["phase"] == ph], seg_key[seg_phase == ph]))
        for ph in np.unique(plan["phase"]).tolist()
    )
    # how long units waited: each (source, doc_id, start)'s placements paired in step order with its plannings
    planned: dict[tuple[int, ...], list[int]] = {}
    keys = np.stack([plan["src"], plan["doc_id"], plan["start"]], axis=1).tolist()
    for key, step in zip(map(tuple, keys), plan["step"].tolist(), strict=True):
        planned.setdefault(key, []).append(step)
    placed: dict[tuple[int, ...], list[int]] = {}
    seg_step = np.repeat(p.seq_step, np.diff(p.seg_offsets)).tolist()
    for key, step in zip(map(tuple, p.segments[:, :3].tolist()), seg_step, strict=True):
        placed.setdefault(key, []).append(step)
    waits = [
        a - b
        for key, got in placed.items()
        if len(got) == len(planned[key])  # a unit dropped once: its pairing is ambiguous, left out
        for a, b in zip(sorted(got), sorted(planned[key]), strict=True)
    ]
    return {
        "pct": float(pct.mean()) if len(pct) else float("nan"),
        "lost": lost,
        "first": int((p.dropped[:, 2] == 0).sum()),
        "units": len(p.dropped),
        "wait": max(waits, default=0),
    }


def document_share(p: Packing, window: int = 10) -> float:
    """The largest share of any one document (source, doc_id) in the tokens of any ``window`` consecutive steps
    of the packing: how much of what the trainer sees over a window one long document can be."""
    steps = np.repeat(p.seq_step, np.diff(p.seg_offsets))
    segs = p.segments
    key = segs[:, 0] * (int(segs[:, 1].max()) + 1 if len(segs) else 1) + segs[:, 1]
    n_steps = int(p.seq_step.max()) + 1 if len(p.seq_step) else 0
    worst = 0.0
    for start in range(max(1, n_steps - window + 1)):
        sel = (steps >= start) & (steps < start + window)
        if sel.any():
            tokens = np.bincount(np.unique(key[sel], return_inverse=True)[1], weights=segs[sel, 3])
            worst = max(worst, float(tokens.max() / tokens.sum()))
    return worst
