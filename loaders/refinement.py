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
cost) rise above ``max(its own, slack)``. So each window depends on the one before it: the planner
computes windows in order and the loader's state carries the context (a few integers per source).

Phase boundaries: a window of ``period`` steps across a boundary holds the last steps of one
phase's template and the first of the next's. When the phases' mixtures or cost classes differ (a warmup of
short documents, an anneal with fewer books), those partial templates miss the plan: by 0.1–0.27 with the
heaviest classes first in both, by about 0.05 once the next phase's order is matched to the previous one's
last block (:mod:`loaders.order`, the planner's default layout), since a step of one cost class is whole.
No swap between steps of one cost class can do better: each step near the boundary must itself hold about
its phase's mixture, i.e. mix cost classes. So at a boundary whose unrefined windows miss by more than
:data:`EDGE_BOUNDARY` (:func:`boundary_error`), the phase's last window counts the windows into the next
phase's first steps (taken on the build's mixture) and it and the next phase's first windows are *edges*:
they may swap sequences of different cost and source, under the least balance bound of
:data:`EDGE_SLACKS` that brings their windows within :data:`EDGE_GOAL`. Balance is given up only there,
but on real lengths a handover from mixed steps to the one-class template needs several blocks, so the
windows after the edges miss again unless the edges cover the whole phase, and then the balance is about the
build's: edges are opt-in (:class:`loaders.planner.StepPlanner`'s ``edge_windows``, a trainer's
``Balance(edges=N)``; figures in ``benchmarks/curriculum.py``).

Pure numpy, deterministic (ties broken by index).
"""

from __future__ import annotations

import numpy as np

from contract.record import Regroup

__all__ = [
    "EDGE_BOUNDARY",
    "EDGE_GOAL",
    "EDGE_SLACKS",
    "PAIRS",
    "SLACK",
    "THRESHOLDS",
    "boundary_error",
    "refine_steps",
]

SLACK = Regroup().slack  # the contract's default balance bound of a swap (contract.record.Regroup)
THRESHOLDS = (0.004, 0.002)  # window errors below these stop counting, pass by pass
PAIRS = 5120  # candidate pairs per swap search (16 cost neighbours each at 320 sequences)
EDGE_SLACKS = (1.15, 1.3, 1.5, 2.0)  # balance bounds tried in turn at a phase boundary (then none)
EDGE_BOUNDARY = 0.03  # a boundary's unrefined window error above which it needs edges (the refinement alone
# brings one of 0.01 back within the goal: two phases of one mixture; 0.1-0.27 between unequal phases)
EDGE_GOAL = 0.008  # the window error an edge's bound must reach (the goal 0.01, less a margin for later steps)


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
    edge: bool = False,
    ahead: np.ndarray | None = None,
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

    ``target`` may hold up to ``period − 1`` rows more than ``k + steps``: the steps just *after* the window
    (the next phase's first steps, at a phase's end), whose windows count too: so that a phase's last steps
    leave the next phase's first windows on the mixture. ``ahead`` (as many rows): what those steps will
    hold (default: the target; a phase's first window passes the next window's regrouped steps, so that
    its mixed steps hand over to the cost template without a jump).
    ``edge`` (a window at a phase boundary whose regrouped steps do not line up, :func:`boundary_error`):
    sequences of different sources and cost may swap too (one candidate per step and source), which mixes
    the cost classes of steps where the windows across the boundary need it, under the least bound of
    :data:`EDGE_SLACKS` (then none) that brings every window within :data:`EDGE_GOAL`.
    """
    costs = np.asarray(costs, dtype=np.float64)
    src = np.asarray(source_tokens, dtype=np.float64)
    new = np.asarray(step_of, dtype=np.int64).copy()
    steps, k0 = int(new.max()) + 1 if len(new) else 0, len(context)
    target = np.asarray(target, dtype=np.float64)
    n_ahead = len(target) - k0 - steps  # steps after the window (0 unless at a phase's end)
    if not 0 <= n_ahead < max(period, 1):
        raise ValueError(f"target has {len(target)} rows; expected {k0 + steps} to {k0 + steps + period - 1}")
    ends = np.arange(k0 + 1, k0 + steps + n_ahead + 1)
    ends = ends[ends >= period]  # windows [e - period, e) of full length that end inside or just after
    if len(ends) == 0 or steps < 2:
        return new
    g = np.arange(steps) + k0
    member = ((g[None, :] >= (ends - period)[:, None]) & (g[None, :] < ends[:, None])).astype(np.float64)
    later = target[k0 + steps :] if ahead is None else np.asarray(ahead, dtype=np.float64).reshape(-1, src.shape[1])
    if len(later) != n_ahead:
        raise ValueError(f"ahead has {len(later)} rows; expected {n_ahead}")
    context = np.asarray(context, dtype=np.float64).reshape(k0, src.shape[1])
    before = np.concatenate([context, np.zeros((steps, src.shape[1])), later])  # the window's own: swapped
    fixed = np.stack([before[max(0, e - period) : e].sum(axis=0) for e in ends])
    want_tokens = np.stack([target[e - period : e].sum(axis=0) for e in ends])
    want = want_tokens / np.maximum(want_tokens.sum(axis=1, keepdims=True), 1.0)
    if neighbours is None:  # ~5000 candidate pairs: each swap's search costs the same at any window size
        neighbours = int(np.clip(round(PAIRS / max(len(costs), 1)), 1, 16))
    order = np.argsort(costs, kind="stable")
    i_all = np.repeat(order, neighbours)
    j_pos = np.repeat(np.arange(len(order)), neighbours) + np.tile(np.arange(1, neighbours + 1), len(order))
    ok = j_pos < len(order)
    pi, pj = i_all[ok], order[j_pos[ok]]  # candidate pairs: each sequence with its next ones in cost
    problem = (costs, src, fixed, member, want, pi, pj)
    if not edge:
        return _swaps(problem, new, slack, False, max_swaps)[0]
    # at an edge, the least balance bound that brings every window within EDGE_GOAL (else the last, unbounded)
    best: tuple[float, np.ndarray] | None = None
    for bound in sorted({slack, *(x for x in EDGE_SLACKS if x > slack), np.inf}):
        out, worst = _swaps(problem, new, bound, True, max_swaps)
        if worst <= EDGE_GOAL:
            return out
        if best is None or worst < best[0] - 1e-4:
            best = (worst, out)
    assert best is not None
    return best[1]


Problem = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def _swaps(problem: Problem, step_of: np.ndarray, slack: float, edge: bool, max_swaps: int) -> tuple[np.ndarray, float]:
    """The swap search of :func:`refine_steps` from ``step_of``; returns the new steps and the largest window
    error left."""
    costs, src, fixed, member, want, pi, pj = problem
    new = step_of.copy()
    steps = member.shape[1]
    worst = np.inf
    for threshold in THRESHOLDS:
        for _ in range(max_swaps):
            comp = np.zeros((steps, src.shape[1]))
            np.add.at(comp, new, src)
            tot = fixed + member @ comp  # [windows, sources]
            share_tot = np.maximum(tot.sum(axis=1, keepdims=True), 1.0)
            err = tot / share_tot - want
            worst = float(np.abs(err).max())
            if worst <= threshold:  # nothing above this pass's threshold: on to the next
                break
            now = _excess(err, threshold)
            # at an edge, also one sequence per step and main source with every other such one
            ci, cj = _cross_pairs(costs, src, new, pi, pj) if edge else (pi, pj)
            a, b = new[ci], new[cj]
            live = a != b
            ci, cj, a, b = ci[live], cj[live], a[live], b[live]
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
    comp = np.zeros((steps, src.shape[1]))
    np.add.at(comp, new, src)
    tot = fixed + member @ comp
    worst = float(np.abs(tot / np.maximum(tot.sum(axis=1, keepdims=True), 1.0) - want).max())
    return new, worst


def boundary_error(before: np.ndarray, after: np.ndarray, target: np.ndarray, period: int) -> float:
    """Largest share error over sources of the ``period``-step windows that straddle a phase boundary, when
    the steps just ``before`` it (tokens per source, [≥ period − 1, sources]) meet those just ``after`` it
    ([≥ period − 1, sources]), against ``target`` (the build's steps at the same places, [len(before) +
    len(after), sources]). A boundary whose regrouped steps already meet within :data:`EDGE_BOUNDARY` (two
    phases of one mixture) needs no edge: their templates line up and the refinement does the rest."""
    got = np.concatenate([before, after]).astype(np.float64)
    want = np.asarray(target, dtype=np.float64)
    b = len(before)
    worst = 0.0
    for e in range(max(period, b + 1), min(len(got), b + period - 1) + 1):
        r, p = got[e - period : e].sum(axis=0), want[e - period : e].sum(axis=0)
        worst = max(worst, float(np.abs(r / max(r.sum(), 1.0) - p / max(p.sum(), 1.0)).max()))
    return worst


def _cross_pairs(
    costs: np.ndarray, src: np.ndarray, step_of: np.ndarray, pi: np.ndarray, pj: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The pairs ``pi``, ``pj`` plus every pair of representatives in different steps: per step and main
    source (the source of most of a sequence's tokens), its sequence of median cost."""
    main = np.argmax(src, axis=1)
    key = step_of * src.shape[1] + main
    order = np.lexsort((np.arange(len(costs)), costs, key))
    first = np.flatnonzero(np.r_[True, key[order][1:] != key[order][:-1]])
    size = np.diff(np.r_[first, len(order)])
    reps = order[first + size // 2]
    a, b = np.triu_indices(len(reps), 1)
    keep = step_of[reps[a]] != step_of[reps[b]]
    return np.r_[pi, reps[a][keep]], np.r_[pj, reps[b][keep]]


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
