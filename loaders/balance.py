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
   ``P × global_batch`` sequences, is sorted) for a ``mixture_error`` per window near the build's own.
   A phase's last partial block of ``r = steps mod P`` steps is regrouped with the whole block before it
   (:func:`regroup_bounds`) and repeats ``r`` of the template's classes (:func:`template_slots`), spread
   over the cost range and placed first in the whole phase's template, so the layout stays periodic up
   to the phase's end. It cannot be exact: a unit of ``P + r`` steps of one cost class each has classes
   of ``1/(P + r)`` or ``2/(P + r)`` of its sequences against ``1/P`` in the blocks before, and the ``r``
   repeated classes need not hold the mixture; windows reaching into that unit drift by ~0.02 on real
   lengths (0.2 before), the rest as before. With ``m > 1`` copies of a class in a unit, its sequences
   are dealt one by one over the copies so that every block gets the same part of the class. Which class
   takes which position (``order``; heaviest first by default) changes neither the balance nor the windows
   inside a phase, only those across a phase boundary: :mod:`loaders.order` chooses it there.

3. :func:`assign_unequal` (``micro_batches: unequal`` in the mix file, after ByteScale): the counts per rank
   may differ, which balances a step of several long-context sequences per rank without moving sequences
   between steps, so the mixture of every step stays the build's.

Costs are the build's, as stored in its shards (:mod:`contract.cost`: Σ over a sequence's documents).
"""

from __future__ import annotations

import heapq

import numpy as np

__all__ = [
    "assign_ranks",
    "assign_unequal",
    "dp_imbalance",
    "regroup_bounds",
    "regroup_window",
    "tail_classes",
    "template_order",
    "template_slots",
]


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
    # the lightest open rank, ties to the lowest index: a heap of (load, rank) pops exactly that
    heap = [(0.0, r) for r in range(dp_size)]
    counts = [0] * dp_size
    load_list = [0.0] * dp_size
    cost_list = costs.tolist()
    for i in np.argsort(-costs, kind="stable").tolist():
        r = heapq.heappop(heap)[1]
        ranks[i] = r
        load_list[r] += cost_list[i]  # the same additions in the same order as a numpy running sum
        counts[r] += 1
        if counts[r] < per:
            heapq.heappush(heap, (load_list[r], r))
    loads[:] = load_list
    table = np.argsort(ranks, kind="stable").reshape(dp_size, per)  # [dp, per] sequence indices, ascending
    held = costs[table]  # their costs, kept in step with the table
    for _ in range(max_swap_rounds):
        hi = int(np.argmax(loads))
        mine = held[hi]  # [per]
        # moving d = c_mine - c_theirs from hi to r: the pair's new max must drop below loads[hi]
        d = mine[None, :, None] - held[:, None, :]  # [dp, per, per]
        new_max = np.maximum(loads[hi] - d, loads[:, None, None] + d)
        gain = loads[hi] - new_max
        gain[hi] = -np.inf
        r, a, b = (int(x) for x in np.unravel_index(int(np.argmax(gain)), gain.shape))
        if gain[r, a, b] <= 1e-9 * loads[hi]:
            break
        i, j = int(table[hi, a]), int(table[r, b])
        table[hi, a], table[r, b] = j, i
        held[hi, a], held[r, b] = costs[j], costs[i]
        ranks[i], ranks[j] = r, hi
        loads[hi] -= d[r, a, b]
        loads[r] += d[r, a, b]
    return ranks


def regroup_window(
    costs: np.ndarray,
    source_tokens: np.ndarray,
    steps: int,
    band: float = 0.02,
    period: int = 0,
    tail: int = 0,
    order: np.ndarray | None = None,
) -> np.ndarray:
    """Regroup one window's sequences into ``steps`` steps of equal size; returns the new step (0-based
    within the window, int64 [n]) of each sequence, in the window's original order.

    ``costs`` float [n]; ``source_tokens`` [n, sources] (tokens of each source in each sequence, in the
    build's step order); ``n`` = ``steps`` × the step size. Sequences sorted by cost (in bands of relative
    width ``band``, inside which the build's order is kept) are cut into ``steps`` runs, so each new step
    holds sequences of similar cost (any equal-count assignment of them is balanced). The runs are then
    placed greedily: each next step takes the run that keeps the running per-source token counts closest
    to the build's running counts. With ``period`` > 0 the runs are instead laid out by
    :func:`template_slots`: every block of ``period`` steps, and a last partial block, follow the same cost
    template (see the module's docstring); ``tail`` is the phase's ``steps mod period``, which fixes the
    template of all the phase's windows; ``order`` (default heaviest first) is the phase's class at each
    template position (:func:`template_order`, :mod:`loaders.order`). Deterministic; independent of the
    world size.
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
    by_cost = np.lexsort((np.arange(n), -level))
    group[by_cost] = np.repeat(np.arange(steps), size)
    if period > 0:
        slots = template_slots(steps, period, tail, order)
        pos = slots % period  # template position of each run
        copies = np.bincount(pos, minlength=period)
        first = np.full(period, steps)
        np.minimum.at(first, pos, np.arange(steps))
        # the runs of one class are dealt sequence by sequence over its copies (blocks), so that every
        # block, and the partial block, gets the same share of the class's cost range and thus of its mix
        rank = np.empty(n, dtype=np.int64)
        rank[by_cost] = np.arange(n)
        p = pos[group]
        return (rank - first[p] * size) % copies[p] * period + p
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


def template_slots(steps: int, period: int, tail: int = 0, order: np.ndarray | None = None) -> np.ndarray:
    """Step (int64 [steps]) of each of ``steps`` cost runs, heaviest run first, under the per-block template.

    ``steps = m·period + r`` (``0 ≤ r < period``): ``m`` whole blocks and a partial block of ``r`` steps.
    Run ``i`` belongs to cost class ``⌊(i + ½)·period / steps⌋`` (the deciles for ``period = 10``), so each
    class has ``m`` or ``m + 1`` runs and, whatever ``m``, the same fraction of the unit's cost range; the
    ``r`` classes with ``m + 1`` runs (:func:`tail_classes`, spread over the range) take the template's
    first ``r`` positions, the others follow, each part heaviest first; copy ``k`` of the class at
    position ``p`` goes to step ``k·period + p``. So any ``period`` consecutive steps hold each class once,
    also across the partial block, and since the repeated classes are spread over the cost range the
    partial block keeps about the unit's mixture. Units with ``r = 0`` order their classes as a unit with
    ``r = tail`` would (pass the phase's ``steps mod period``), so that all units of one phase share one
    template. A unit shorter than ``period`` (``m = 0``) holds one step of each of its ``r`` classes.
    ``order``: the classes in template order instead of heaviest first (see :func:`template_order`).
    """
    if steps < 1 or period < 1:
        raise ValueError(f"need steps ≥ 1 and period ≥ 1, got {steps} and {period}")
    position = np.argsort(template_order(period, steps % period or tail % period, order))  # class → position
    cls = ((np.arange(steps) + 0.5) * period // steps).astype(np.int64)
    copy = np.arange(steps) - np.searchsorted(cls, cls)  # runs are heaviest first: classes ascend
    return copy * period + position[cls]


def template_order(period: int, r: int = 0, order: np.ndarray | None = None) -> np.ndarray:
    """Class (0 = heaviest) at each position of the template of a unit with ``r`` steps over whole blocks:
    ``order`` (int [period], a permutation; default heaviest first) with the unit's :func:`tail_classes`
    moved to the front, each part keeping its order (the partial block repeats the first ``r`` positions)."""
    seq = np.arange(period) if order is None else np.asarray(order, dtype=np.int64)
    if sorted(seq.tolist()) != list(range(period)):
        raise ValueError(f"order must be a permutation of the {period} classes, got {seq.tolist()}")
    first = np.isin(seq, tail_classes(period, r))
    return np.concatenate([seq[first], seq[~first]])


def tail_classes(period: int, r: int) -> np.ndarray:
    """The ``r`` cost classes (ascending, int64) that get one run more in a unit of ``m·period + r`` steps;
    the same for every ``m`` (checked by the tests)."""
    cls = ((np.arange(period + r) + 0.5) * period // (period + r)).astype(np.int64)
    return np.flatnonzero(np.bincount(cls, minlength=period) == 2).astype(np.int64)


def regroup_bounds(first: int, last: int, window: int, period: int = 0) -> list[int]:
    """First step of each regroup unit of the phase holding steps ``first``…``last − 1`` (ascending).

    Units of ``window`` steps; with ``period`` > 0 a last unit shorter than ``period`` joins the one before
    it (so the phase's partial block of the template regroups together with a whole block and can repeat
    its first positions, see :func:`template_slots`). Units never cross the phase; pure function of its
    arguments (no world size).
    """
    starts = list(range(first, last, window))
    if period > 0 and len(starts) > 1 and last - starts[-1] < period:
        starts.pop()
    return starts


def assign_unequal(
    costs: np.ndarray,
    dp_size: int,
    max_rounds: int = 64,
    tokens: np.ndarray | None = None,
    max_tokens: int | None = None,
) -> np.ndarray:
    """DP rank (int64 [n]) of each of one step's ``n ≥ dp_size`` sequences, counts free (at least one each).

    The ``dp_size`` heaviest sequences open one rank each, the rest go heaviest first onto the least loaded
    rank (LPT without the count constraint); then, while it lowers the heaviest rank, one of its sequences
    moves to another rank (keeping at least one) or swaps with one there. With ``tokens`` (real tokens of
    each sequence) and ``max_tokens``, no rank ever holds more than ``max_tokens`` real tokens (the memory
    budget of a variable-length micro-batch); when the greedy start cannot meet it, the step falls back to
    LPT with at most ``⌈n / dp_size⌉`` sequences per rank (which the caller makes sure fit the budget).
    Deterministic (ties by index).
    Without a token budget, never above the list-scheduling bound ``mean + max cost``.
    """
    costs = np.asarray(costs, dtype=np.float64)
    n = len(costs)
    if n < dp_size:
        raise ValueError(f"{n} sequences cannot give each of dp_size {dp_size} ranks at least one")
    tok = np.zeros(n) if tokens is None else np.asarray(tokens, dtype=np.float64)
    cap = np.inf if max_tokens is None else float(max_tokens)
    ranks = np.empty(n, dtype=np.int64)
    loads, used = np.zeros(dp_size), np.zeros(dp_size)
    for k, i in enumerate(np.argsort(-costs, kind="stable")):
        room = np.flatnonzero(used + tok[i] <= cap)
        if k >= dp_size and len(room) == 0:
            return _nearly_equal(costs, dp_size)
        r = k if k < dp_size else int(room[np.argmin(loads[room])])
        ranks[i] = r
        loads[r] += costs[i]
        used[r] += tok[i]
    for _ in range(max_rounds):
        hi = int(np.argmax(loads))
        mine, others = np.flatnonzero(ranks == hi), np.flatnonzero(ranks != hi)
        # a move of i (from hi to rank r) is a swap with a zero-cost, zero-token sequence of r: one table
        give = costs[mine][:, None]  # [k, 1]
        take = np.concatenate([costs[others], np.zeros(dp_size)]) if len(mine) > 1 else costs[others]
        take_tok = np.concatenate([tok[others], np.zeros(dp_size)]) if len(mine) > 1 else tok[others]
        dest = np.concatenate([ranks[others], np.arange(dp_size)]) if len(mine) > 1 else ranks[others]
        d = give - take[None, :]  # load leaving hi
        gain = loads[hi] - np.maximum(loads[hi] - d, loads[dest][None, :] + d)
        gain[:, dest == hi] = -np.inf
        dt = tok[mine][:, None] - take_tok[None, :]  # tokens leaving hi
        gain[(used[dest][None, :] + dt > cap) | (used[hi] - dt > cap)] = -np.inf
        if gain.size == 0:  # one rank, or one sequence on the heaviest and none elsewhere to swap
            break
        a, b = (int(x) for x in np.unravel_index(int(np.argmax(gain)), gain.shape))
        if gain[a, b] <= 1e-9 * loads[hi]:
            break
        i, r = int(mine[a]), int(dest[b])
        ranks[i] = r
        if b < len(others):  # a swap: the other sequence comes to hi
            ranks[int(others[b])] = hi
        loads[hi] -= d[a, b]
        loads[r] += d[a, b]
        used[hi] -= dt[a, b]
        used[r] += dt[a, b]
    return ranks


def _nearly_equal(costs: np.ndarray, dp_size: int) -> np.ndarray:
    """LPT with at most ``⌈n / dp_size⌉`` sequences per rank (int64 [n] ranks)."""
    limit = -(-len(costs) // dp_size)
    ranks = np.empty(len(costs), dtype=np.int64)
    loads, counts = np.zeros(dp_size), np.zeros(dp_size, dtype=np.int64)
    for i in np.argsort(-costs, kind="stable"):
        open_ = np.flatnonzero(counts < limit)
        r = int(open_[np.argmin(loads[open_])])
        ranks[i], loads[r], counts[r] = r, loads[r] + costs[i], counts[r] + 1
    return ranks
