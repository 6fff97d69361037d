"""Refinement: swaps between the steps of one regrouped window that keep every ``period``-step window of
*training* steps on the build's mixture.

:func:`loaders.balance.regroup_window` makes steps of one cost class each (even steps at one sequence per
rank) and lays them out by a per-block template, so any ``period`` consecutive steps hold each class once.
What is left is the difference between neighbouring blocks: where two classes of similar cost hold
different sources (pieces of long books next to packs of multilingual documents), the boundary between
them falls differently in each block, and a window that takes one class from one block and the next class
from the other sees one source too often (up to 2–3 full-length pieces, 0.015–0.02 of a 16-sequence
window). :func:`refine_steps` removes most of it: with the compositions of the training steps just before
the window fixed (the *context*), it swaps pairs of sequences of close cost between the window's steps while
that lowers the mixture error of the windows ending inside it, and never lets a step's balance (max/mean
cost) rise above ``max(its own, slack)``. So each window depends on the one before it: the schedule
computes windows in order and the loader's state carries the context (a few integers per source).

Pure numpy, deterministic (ties broken by index).
"""

from __future__ import annotations

import numpy as np

__all__ = ["PAIRS", "SLACK", "THRESHOLDS", "refine_steps"]

SLACK = 1.15  # a swap may raise a step's max/mean cost up to this (the DP goal's p95 at long context)
THRESHOLDS = (0.004, 0.002)  # window errors below these stop counting, pass by pass
PAIRS = 5120  # candidate pairs per swap search (16 cost neighbours each at 320 sequences)


def refine_steps(
    costs: np.ndarray,
    source_tokens: np.ndarray,
    step_of: np.ndarray,
    context: np.ndarray,
    target: np.ndarray,
    period: int,
    slack: float = SLACK,
    neighbours: int | None = None,
    max_swaps: int = 400,
) -> np.ndarray:
    """New step (int64 [n], 0-based in the window) of each sequence after refinement.

    ``costs`` float [n]; ``source_tokens`` [n, sources]; ``step_of`` int [n]: the regrouped step of each
    sequence (``steps`` steps of equal size); ``context`` [k, sources] (``k < period``): tokens per source of
    the ``k`` training steps just before the window; ``target`` [k + steps, sources]: tokens per source of the
    *build's* steps at the same positions (context steps first), whose windows are the mixture to keep.
    Every full window of ``period`` steps ending inside this window counts: its share of each source against
    the target's. Each pass (one per entry of :data:`THRESHOLDS`) applies, one at a time, the swap of two
    sequences in different steps (each with one of its ``neighbours`` nearest in cost; by default as many as
    keep about :data:`PAIRS` candidate pairs, 1–16) that lowers the sum of squared excess errors most, until
    no window is above the pass's threshold; a swap must keep each of its two steps at or below ``max(its
    balance, slack)``. Step sizes never change.
    """
    costs = np.asarray(costs, dtype=np.float64)
    src = np.asarray(source_tokens, dtype=np.float64)
    new = np.asarray(step_of, dtype=np.int64).copy()
    steps, k0 = int(new.max()) + 1 if len(new) else 0, len(context)
    ends = np.arange(k0 + 1, k0 + steps + 1)
    ends = ends[ends >= period]  # windows [e - period, e) of full length that end inside this window
    if len(ends) == 0 or steps < 2:
        return new
    g = np.arange(steps) + k0
    member = ((g[None, :] >= (ends - period)[:, None]) & (g[None, :] < ends[:, None])).astype(np.float64)
    before = np.asarray(context, dtype=np.float64).reshape(k0, src.shape[1])
    fixed = np.stack([before[max(0, e - period) : min(k0, e)].sum(axis=0) for e in ends])
    want_tokens = np.stack([target[e - period : e].sum(axis=0) for e in ends])
    want = want_tokens / np.maximum(want_tokens.sum(axis=1, keepdims=True), 1.0)
    if neighbours is None:  # ~5000 candidate pairs: each swap's search costs the same at any window size
        neighbours = int(np.clip(round(PAIRS / max(len(costs), 1)), 1, 16))
    order = np.argsort(costs, kind="stable")
    i_all = np.repeat(order, neighbours)
    j_pos = np.repeat(np.arange(len(order)), neighbours) + np.tile(np.arange(1, neighbours + 1), len(order))
    ok = j_pos < len(order)
    pi, pj = i_all[ok], order[j_pos[ok]]  # candidate pairs: each sequence with its next ones in cost
    for threshold in THRESHOLDS:
        for _ in range(max_swaps):
            comp = np.zeros((steps, src.shape[1]))
            np.add.at(comp, new, src)
            tot = fixed + member @ comp  # [windows, sources]
            share_tot = np.maximum(tot.sum(axis=1, keepdims=True), 1.0)
            err = tot / share_tot - want
            if (np.abs(err) <= threshold).all():  # nothing above this pass's threshold: on to the next
                break
            now = _excess(err, threshold)
            a, b = new[pi], new[pj]
            live = a != b
            ci, cj, a, b = pi[live], pj[live], a[live], b[live]
            if len(ci) == 0:
                break
            d = src[cj] - src[ci]  # step a gives i and takes j; step b the reverse
            moved = tot[None] + (member[:, a] - member[:, b]).T[:, :, None] * d[:, None, :]
            score = _excess(moved / share_tot[None] - want[None], threshold, axis=(1, 2))
            score[~_balanced(costs, new, steps, ci, cj, a, b, slack)] = np.inf
            best = int(np.argmin(score))
            if not score[best] < now - 1e-12:
                break
            new[ci[best]], new[cj[best]] = b[best], a[best]
    return new


def _excess(err: np.ndarray, threshold: float, axis: int | tuple[int, ...] | None = None) -> np.ndarray:
    """Σ of squared errors beyond ``threshold`` (smooth, so that many windows improve together), plus a tiny
    share of the largest error (which breaks ties toward the smaller maximum)."""
    over = np.maximum(np.abs(err) - threshold, 0.0)
    return (over * over).sum(axis=axis) + 1e-6 * np.abs(err).max(axis=axis)


def _balanced(
    costs: np.ndarray,
    new: np.ndarray,
    steps: int,
    ci: np.ndarray,
    cj: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    slack: float,
) -> np.ndarray:
    """Whether swapping ``ci`` (in step ``a``) with ``cj`` (in step ``b``) keeps both steps' max/mean cost at
    or below ``max(now, slack)`` (the new maximum is bounded from above: the old one or the incoming cost)."""
    count = np.bincount(new, minlength=steps).astype(np.float64)
    total = np.bincount(new, weights=costs, minlength=steps)
    top = np.full(steps, -np.inf)
    np.maximum.at(top, new, costs)
    now = top / (total / count)
    new_a = np.maximum(top[a], costs[cj]) / ((total[a] - costs[ci] + costs[cj]) / count[a])
    new_b = np.maximum(top[b], costs[ci]) / ((total[b] - costs[cj] + costs[ci]) / count[b])
    return (new_a <= np.maximum(now[a], slack)) & (new_b <= np.maximum(now[b], slack))
