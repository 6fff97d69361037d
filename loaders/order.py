"""Template order: which cost class takes which position of a phase's per-block template.

:func:`loaders.balance.regroup_window` lays a phase's regrouped steps out by one template per block of
``period`` steps: each position holds one cost class, and any ``period`` consecutive steps of the phase hold
each class once, so a window of the stream inside the phase keeps the build's mixture whatever the order of
the positions. DP balance does not depend on that order either (it depends only on which sequences share a
step). A window that *crosses a phase boundary* does depend on it: it holds the previous phase's last
``period − j`` positions and the next phase's first ``j``, and classes of different cost hold different
sources (full-length pieces of long books in the heaviest, packs of short documents in the lightest). With
the heaviest classes first in both phases, the first ``j`` steps of the next phase hold all of its books and
the last steps of the previous phase none: 0.2–0.27 off the plan.

:func:`match_order` picks the next phase's order so that every window across the boundary stays as near the
build's as whole steps of one class allow. A window ending ``j`` steps after the boundary strays from the
build by (tokens per source) the deviation of the next phase's first ``j`` steps from the build's same steps
(:math:`D_B(j)`: a function of the *set* of classes placed first) plus the deviation of the previous
phase's last ``period − j`` steps (fixed by its order). The largest share error over ``j`` and sources is
minimized exactly over all orders by dynamic programming over the sets of classes (``2^period`` sets; up to
:data:`EXACT` classes, greedily beyond). The next phase's first steps are the build's own there, ramps
included, so the order follows a ramp too. Steps of one class are whole, so what is left is a fraction of one
step per heavy source (about 0.04–0.06 where a phase brings a source that only full-length pieces hold);
within 0.01 there needs steps that mix cost classes, i.e. DP imbalance (``edge_windows`` in
:class:`loaders.planner.StepPlanner`, ``Balance(edges=N)``; the trade-off in ``benchmarks/curriculum.py``).

Pure numpy, deterministic (ties to the lowest class), independent of the world size.
"""

from __future__ import annotations

import numpy as np

from loaders.balance import regroup_window, tail_classes, template_order

__all__ = ["EXACT", "first_block", "match_order"]

EXACT = 12  # classes up to which the order is exact (2^12 sets); beyond, each position is chosen greedily


def first_block(costs: np.ndarray, source_tokens: np.ndarray, steps: int, period: int, tail: int = 0) -> np.ndarray:
    """Tokens per source of each cost class (0 = heaviest) in the first block of a regrouped unit of ``steps``
    ≥ ``period`` steps (float64 [period, sources]); arguments as :func:`loaders.balance.regroup_window`'s."""
    if steps < period:
        raise ValueError(f"a unit of {steps} steps has no whole block of {period}")
    src = np.asarray(source_tokens, dtype=np.float64)
    new = regroup_window(costs, src, steps, period=period, tail=tail)
    comp = np.zeros((steps, src.shape[1]))
    np.add.at(comp, new, src)
    position = np.argsort(template_order(period, steps % period or tail % period))
    return comp[position]


def match_order(
    classes: np.ndarray,
    build: np.ndarray,
    before: np.ndarray,
    before_build: np.ndarray,
    r: int = 0,
) -> np.ndarray:
    """Class at each template position (int64 [period]) for a phase whose first block's classes hold
    ``classes`` (tokens per source, [period, sources], from :func:`first_block`), against ``build`` (the
    build's first ``period`` steps of the phase, [period, sources]).

    ``before`` / ``before_build`` ([k ≤ period, sources]): the training steps just before the phase as the
    previous phase lays them out (its last regrouped steps), and the build's same steps; none for a run's
    first phase (the order then keeps every prefix of the block nearest the build's). Minimizes, over every
    window of ``period`` steps ending inside the first block, the largest share error over sources against
    the build's same window; the ``r`` :func:`~loaders.balance.tail_classes` come first (the phase's partial
    block repeats them). Exact up to :data:`EXACT` classes.
    """
    cls = np.asarray(classes, dtype=np.float64)
    period, n_src = cls.shape
    built = np.concatenate([np.zeros((1, n_src)), np.cumsum(np.asarray(build, dtype=np.float64), axis=0)])
    pre, pre_build = (np.asarray(x, dtype=np.float64).reshape(-1, n_src)[-period:] for x in (before, before_build))
    pad = np.zeros((period - len(pre), n_src))
    dev, pre_build = np.concatenate([pad, pre - pre_build]), np.concatenate([pad, pre_build])
    # the window ending j steps into the phase: the last period − j steps before it (fixed) and the first j
    fixed = np.array([dev[j:].sum(axis=0) for j in range(period + 1)])  # [period + 1, sources]
    tokens = np.array([pre_build[j:].sum() + built[j].sum() for j in range(period + 1)])
    if not len(pre):  # a run's first phase: each prefix against a window's worth of tokens
        tokens[:] = built[-1].sum()
    tokens = np.maximum(tokens, 1.0)
    first = tail_classes(period, r) if r else np.zeros(0, dtype=np.int64)
    if period <= EXACT:
        return _exact(cls, fixed - built, tokens, first)
    out: list[int] = []
    total = np.zeros(n_src)
    for j in range(1, period + 1):
        left = [c for c in range(period) if c not in out and (c in first or len(out) >= len(first))]
        err = [float(np.abs(fixed[j] - built[j] + total + cls[c]).max() / tokens[j]) for c in left]
        out.append(left[int(np.argmin(err))])
        total += cls[out[-1]]
    return np.array(out, dtype=np.int64)


def _exact(cls: np.ndarray, offset: np.ndarray, tokens: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Minimax order by dynamic programming over the sets of classes: a set of ``k`` classes placed first
    has error max over sources of ``|offset[k] + Σ cls[set]| / tokens[k]``; the order's error is the largest
    over its prefixes (see :func:`match_order`)."""
    period = len(cls)
    sets = 1 << period
    total = np.zeros((sets, cls.shape[1]))
    size = np.zeros(sets, dtype=np.int64)
    for m in range(1, sets):
        low = (m & -m).bit_length() - 1
        total[m], size[m] = total[m & (m - 1)] + cls[low], size[m & (m - 1)] + 1
    here = np.abs(offset[size] + total).max(axis=1) / tokens[size]
    must = int(sum(1 << int(c) for c in first))
    worst = np.full(sets, np.inf)  # the least largest error over the orders of the set's classes
    last = np.full(sets, -1, dtype=np.int64)
    worst[0] = 0.0
    for m in range(1, sets):  # a set's subsets are numbered below it
        if (m & must) != (m if size[m] <= len(first) else must):  # the tail classes take the first positions
            continue
        for c in range(period):
            if m >> c & 1 and max(worst[m ^ (1 << c)], here[m]) < worst[m]:
                worst[m], last[m] = max(worst[m ^ (1 << c)], here[m]), c
    out, m = [], sets - 1
    while m:
        out.append(int(last[m]))
        m ^= 1 << int(last[m])
    return np.array(out[::-1], dtype=np.int64)
