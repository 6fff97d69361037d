"""DP balance: which training step gets which sequences, and which DP rank gets which of them.

Pure numpy, deterministic; only :func:`assign_ranks` depends on the world size. Two levers:

1. :func:`assign_ranks`: one step's ``global_batch`` sequences dealt to ``dp_size`` ranks, equal counts,
   minimizing the maximum per-rank cost: longest-processing-time first under the count constraint, then
   pairwise swaps that lower the heaviest rank while any helps.
2. :func:`regroup_window`: outlier delay (WLB-LLM). When a rank holds one or few sequences per step, no
   assignment can balance a step holding one full-length book piece (cost ~S²) and packs of short
   documents. The sequences of a bounded window of ``W`` consecutive steps of one phase are regrouped
   by cost into ``W`` new steps of the same size, so that each step holds sequences of similar cost
   (no sequence moves more than ``W − 1`` steps); the new steps are ordered so that the cumulative
   per-source token counts track the build's, which bounds the mixture drift of any window of steps.
   With ``period = P`` (10 matches the ``mixture_error`` window) the new steps instead follow one
   template per block of ``P`` steps, heaviest first: any ``P`` consecutive steps of a phase then hold
   each template position once, so every window of ``P`` steps has the build's mixture up to the
   difference between neighbouring blocks. This trades a little balance (one block of ``P`` steps,
   ``P × global_batch`` sequences, is sorted) for a ``mixture_error`` per window near the build's own;
   only windows reaching into a phase's last partial block (``steps mod P``) miss it.

Cost of a sequence = Σ over its documents of ``attention·l² + linear·l`` (the build's cost model).
"""

from __future__ import annotations

import numpy as np

__all__ = ["assign_ranks", "dp_imbalance", "regroup_window", "segment_cost"]


def segment_cost(lengths: np.ndarray, attention: float, linear: float) -> float:
    """Cost of one sequence holding documents (or pieces) of ``lengths`` tokens (float, arbitrary units)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    return float(attention * (lengths * lengths).sum() + linear * lengths.sum())


def dp_imbalance(costs: np.ndarray, ranks: np.ndarray, dp_size: int) -> float:
    """max over DP ranks of Σcost ÷ mean over DP ranks (1.0 is perfect) for one step."""
    loads = np.bincount(ranks, weights=costs, minlength=dp_size)
    mean = loads.mean()
    return float(loads.max() / mean) if mean > 0 else 1.0


def assign_ranks(costs: np.ndarray, dp_size: int, max_swap_rounds: int = 64) -> np.ndarray:
    """DP rank (int64 [n]) of each of one step's ``n`` sequences; every rank gets ``n / dp_size`` of them.

    LPT under the equal-count constraint (heaviest first, onto the lightest rank that still has room),
    then local search: swap one sequence of the heaviest rank with one of another rank when that lowers
    the heaviest of the two, up to ``max_swap_rounds`` times. Deterministic (ties broken by index).
    """
    costs = np.asarray(costs, dtype=np.float64)
    n = len(costs)
    if n % dp_size:
        raise ValueError(f"{n} sequences cannot be split evenly over dp_size {dp_size}")
    per = n // dp_size
    ranks = np.empty(n, dtype=np.int64)
    if per == 1:  # nothing to choose: any bijection has the same max
        ranks[np.argsort(-costs, kind="stable")] = np.arange(n)
        return ranks
    loads = np.zeros(dp_size)
    counts = np.zeros(dp_size, dtype=np.int64)
    for i in np.argsort(-costs, kind="stable"):
        open_ = np.flatnonzero(counts < per)
        r = int(open_[np.argmin(loads[open_])])
        ranks[i] = r
        loads[r] += costs[i]
        counts[r] += 1
    members = [np.flatnonzero(ranks == r).tolist() for r in range(dp_size)]
    for _ in range(max_swap_rounds):
        hi = int(np.argmax(loads))
        table = np.array(members)  # [dp, per] sequence indices
        mine = costs[table[hi]]  # [per]
        # moving d = c_mine - c_theirs from hi to r: the pair's new max must drop below loads[hi]
        d = mine[None, :, None] - costs[table][:, None, :]  # [dp, per, per]
        new_max = np.maximum(loads[hi] - d, loads[:, None, None] + d)
        gain = loads[hi] - new_max
        gain[hi] = -np.inf
        r, a, b = (int(x) for x in np.unravel_index(int(np.argmax(gain)), gain.shape))
        if gain[r, a, b] <= 1e-9 * loads[hi]:
            break
        i, j = int(table[hi, a]), int(table[r, b])
        members[hi][a], members[r][b] = j, i
        ranks[i], ranks[j] = r, hi
        loads[hi] -= d[r, a, b]
        loads[r] += d[r, a, b]
    return ranks


def regroup_window(
    costs: np.ndarray, source_tokens: np.ndarray, steps: int, band: float = 0.02, period: int = 0
) -> np.ndarray:
    """Regroup one window's sequences into ``steps`` steps of equal size; returns the new step (0-based
    within the window, int64 [n]) of each sequence, in the window's original order.

    ``costs`` float [n]; ``source_tokens`` [n, sources] (tokens of each source in each sequence, in the
    build's step order); ``n`` = ``steps`` × the step size. Sequences sorted by cost (in bands of relative
    width ``band``, inside which the build's order is kept) are cut into ``steps`` runs, so each new step
    holds sequences of similar cost (any equal-count assignment of them is balanced). The runs are then
    placed greedily: each next step takes the run that keeps the running per-source token counts closest
    to the build's running counts. With ``period`` > 0 the runs are instead dealt heaviest first to the
    ``max(1, steps // period)`` blocks of ``period`` steps in turn (run ``i`` → block ``i mod m``, position
    ``i // m``), so every block follows the same cost template (see the module's docstring); use a window
    that is a multiple of ``period``. Deterministic; independent of the world size.
    """
    costs = np.asarray(costs, dtype=np.float64)
    n = len(costs)
    if n % steps:
        raise ValueError(f"a window of {n} sequences cannot form {steps} equal steps")
    size = n // steps
    group = np.empty(n, dtype=np.int64)
    # costs within ``band`` of each other are interchangeable for balance: inside a band keep the build's
    # order, which mixes sources, instead of sorting them apart (that would make single-source steps)
    level = np.floor(np.log(np.maximum(costs, 1e-300)) / np.log1p(band)) if band > 0 else costs
    group[np.lexsort((np.arange(n), -level))] = np.repeat(np.arange(steps), size)
    if period > 0:
        m = max(1, steps // period)
        run = np.arange(steps)
        slot_of_run = np.argsort(np.argsort((run % m) * steps + run // m, kind="stable"), kind="stable")
        return slot_of_run[group]
    src = np.asarray(source_tokens, dtype=np.float64)
    target = np.cumsum(src.reshape(steps, size, -1).sum(axis=1), axis=0)  # [steps, sources]
    per_group = np.stack([src[group == k].sum(axis=0) for k in range(steps)])
    placed = np.empty(steps, dtype=np.int64)
    left = list(range(steps))
    running = np.zeros(src.shape[1])
    for slot in range(steps):
        errs = [np.abs(running + per_group[k] - target[slot]).max() for k in left]
        best = left.pop(int(np.argmin(errs)))
        placed[best] = slot
        running += per_group[best]
    return placed[group]
