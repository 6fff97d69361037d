"""The hybrid deal's water-fill (:mod:`loaders.hybrid`, step 3): the short whole documents of a step, many
against the ranks, dealt one class of per-rank time at a time so that no rank rises above the level the
class fills to, and what a class leaves uneven the next, finer, one evens out. numpy here; the compiled
engine runs the classes kernel of :mod:`loaders.hybrid_kernels` instead, to the same deal, bit for bit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from loaders.hybrid_placement import Placement

__all__ = ["CLASSES", "CLASS_RATIO", "classes_of", "water_fill"]

CLASS_RATIO = 32  # the water-fill's classes of per-rank time: each this many times shorter than the one before
CLASSES = 16  # at most this many classes (the last holds everything shorter)


def water_fill(p: Placement, docs: np.ndarray) -> None:
    """Short whole documents ``docs`` (longest first) by water-filling, one class of per-rank time at a
    time (each :data:`CLASS_RATIO` times shorter than the one before), so that what a pass leaves uneven
    the next, finer, pass evens out. Where the level needs more room than the micro-batches have, a pass
    opens what it needs, unless (``per_micro_batch`` > 0) filling without them is faster; the two are
    compared over the whole fill."""
    classes = [c for c in np.split(docs, classes_of(p.time[docs])) if len(c)]
    if p.per_mb <= 0:
        _classes(p, classes, widen=True)
        return
    before, M = p.state(), p.micro_batches
    _classes(p, classes, widen=False)
    # more micro-batches cost every rank per_micro_batch each: a fill that opens one cannot beat the mean, nor
    # the busiest rank before the fill, plus one more of them; it is tried only where this fill is slower
    floor = max(p.mean(), float(before[0].max()))
    if p.makespan() > floor + (M + 1) * p.per_mb:
        plain, plain_time = p.state(), p.makespan()
        p.restore(before)
        _classes(p, classes, widen=True)
        if plain_time <= p.makespan():
            p.restore(plain)


def _classes(p: Placement, classes: list[np.ndarray], widen: bool) -> None:
    if p.kern is not None:
        starts = np.cumsum([0] + [len(c) for c in classes])
        totals = np.array([float(p.time[c].sum()) for c in classes])  # numpy's pairwise sums, as _fill takes them
        p.room = p.kern.classes(
            p.load, p.room, p.first, p.mb, p.time, p.share, np.concatenate(classes),
            starts, totals, p.cap, p.per_mb, widen,
        )  # fmt: skip
        return
    for part in classes:
        # what straddled two shortfalls (a document per rank at most), longer than what follows, first
        p.lpt(_fill(p, part, widen))


def _fill(p: Placement, docs: np.ndarray, widen: bool) -> np.ndarray:
    """One pass of the water-fill. The ranks' shortfalls below the level ``docs`` fill to are laid end to
    end, and so are the documents; a rank takes the documents that lie wholly within its shortfall, so no
    rank rises above the level, and those that straddle two shortfalls (one per rank at most) are
    returned, for the next, finer, pass. Before the runs are laid into the ranks' room (:func:`_runs`),
    ``widen`` opens the micro-batches they need; what does not fit its rank's room goes in runs cut at the
    ranks' free room, and what still does not fit (a document at a micro-batch's end), by ``Placement.lpt``."""
    pending = carried = docs[:0]
    if len(docs):
        t = p.time[docs]
        edges = np.cumsum(np.maximum(_water_level(p.load, float(t.sum())) - p.load, 0.0))
        end = np.cumsum(t)
        rank = np.searchsorted(edges, end - t, side="right")  # the shortfall each document starts in
        inside = rank < p.ranks
        inside[inside] = end[inside] <= edges[rank[inside]] * (1 + 1e-12)
        carried, docs, rank = docs[~inside], docs[inside], rank[inside]
        pending = _runs(p, docs, _widen(p, docs, rank, widen))
    for _ in range(3):
        if not len(pending):
            break
        s = p.share[pending]
        pending = _runs(p, pending, _cut(np.cumsum(p.room.sum(axis=1)), np.cumsum(s) - s / 2, p.ranks))
        need = int(p.share[pending].sum()) - int(p.room.sum())
        if need <= 0:
            break
        p.open_micro_batches(-(-need // (p.ranks * p.cap)))  # capacity is short everywhere
    p.lpt(pending)
    return carried


def _widen(p: Placement, docs: np.ndarray, rank: np.ndarray, widen: bool) -> np.ndarray:
    """``rank``, after opening (when ``widen``) the micro-batches that the runs of ``docs`` to ``rank``
    need beyond the ranks' free room."""
    if widen and len(docs):
        s = p.share[docs]
        short = int((np.bincount(rank, weights=s, minlength=p.ranks) - p.room.sum(axis=1)).max())
        if short > 0:  # a run leaves about a document's room unused at each micro-batch's end
            p.open_micro_batches(-(-(short + int(s.mean()) * p.micro_batches) // p.cap))
    return rank


def _runs(p: Placement, docs: np.ndarray, rank: np.ndarray) -> np.ndarray:
    """Lay ``docs`` into the ranks ``rank`` (nondecreasing: each rank a run of consecutive documents),
    each run into its rank's free room micro-batch after micro-batch (next fit: a document that would
    cross a micro-batch's end starts the next one). Returns the documents that did not fit, in order."""
    n, ranks = len(docs), p.ranks
    s = p.share[docs]
    run = np.searchsorted(rank, np.arange(ranks), side="left")  # each rank's first document
    has = run < n
    end = np.cumsum(s)
    base = np.zeros(ranks, np.int64)
    base[has] = end[run[has]] - s[run[has]]
    pos = end - s - base[rank]  # where each document starts in its rank's free room laid end to end
    bounds = np.cumsum(p.room, axis=1)  # [W, M]: where each micro-batch's free room ends
    M = p.micro_batches
    for m in range(M - 1):
        b = bounds[rank, m]
        cross = np.flatnonzero((pos < b) & (pos + s > b))  # at most one per rank
        if len(cross):
            delta = np.zeros(n, np.int64)
            delta[cross] = b[cross] - pos[cross]
            cum = np.cumsum(delta)
            before = np.zeros(ranks, np.int64)
            before[has] = cum[run[has]] - delta[run[has]]
            pos = pos + cum - before[rank]  # the crossing document and the rest of its run move on
    wide = int(bounds[:, -1].max()) + 1  # rows of the flattened bounds, kept apart
    flat = (bounds + np.arange(ranks)[:, None] * wide).ravel()
    mb = np.searchsorted(flat, rank * wide + np.minimum(pos, wide - 1), side="right") - rank * M
    fit = mb < M
    fit[fit] = pos[fit] + s[fit] <= bounds[rank[fit], mb[fit]]
    placed = docs[fit]
    p.first[placed] = rank[fit]
    p.mb[placed] = mb[fit]
    p.load += np.bincount(rank[fit], weights=p.time[placed], minlength=ranks)
    # the (rank, micro-batch) pairs come in order (ranks nondecreasing, next fit moves forward): sum each
    # pair's shares exactly, in int64, at the start of its run
    cell = rank[fit] * M + mb[fit]
    if len(cell):
        start = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
        p.room[cell[start] // M, cell[start] % M] -= np.add.reduceat(s[fit], start)
    return docs[~fit]


def classes_of(t: np.ndarray) -> np.ndarray:
    """int64 [CLASSES − 1]: where each class of the per-rank times ``t`` (float64, nonincreasing) after the
    first starts: class ``c`` holds the times within ``CLASS_RATIO**c`` to ``CLASS_RATIO**(c+1)`` times
    shorter than ``t[0]`` (the last class, everything shorter), so ``np.split(t, classes_of(t))`` gives
    :data:`CLASSES` runs, some empty."""
    ratio = np.maximum(t[0], 1e-300) / np.maximum(t, 1e-300)
    cls = np.minimum(np.log(ratio) // np.log(CLASS_RATIO), CLASSES - 1).astype(np.int64)
    return np.searchsorted(cls, np.arange(1, CLASSES))


def _cut(edges: np.ndarray, at: np.ndarray, ranks: int) -> np.ndarray:
    """int64: the rank whose span of ``edges`` (cumulative, [W]) holds each of ``at`` (nondecreasing)."""
    return np.minimum(np.searchsorted(edges, at, side="right"), ranks - 1)


def _water_level(load: np.ndarray, total: float) -> float:
    """The level ``h`` with ``Σ max(h − load, 0) = total``."""
    low = np.sort(load)
    k = np.arange(1, len(low) + 1)
    levels = (total + np.cumsum(low)) / k
    # the first k ranks are under the level when the (k+1)-th is not below it
    nxt = np.append(low[1:], np.inf)
    i = int(np.argmax(levels <= nxt))
    return float(levels[i])
