"""The hybrid deal's water-fill (:mod:`loaders.hybrid`, step 3): the short whole documents of a step, many
against the ranks, dealt one class of per-rank time at a time so that no rank rises above the level the
class fills to, and what a class leaves uneven the next, finer, one evens out. numpy here; the compiled
engine runs the classes kernel of :mod:`loaders.hybrid_kernels` instead, to the same deal, bit for bit.
Also the deal's last pass where a micro-batch costs (:func:`merge`: the same documents in fewer micro-batches),
numpy's in both engines.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from loaders.hybrid_placement import Placement

__all__ = ["CLASSES", "CLASS_RATIO", "OVERSHOOT", "classes_of", "merge", "water_fill"]

CLASS_RATIO = 32  # the water-fill's classes of per-rank time: each this many times shorter than the one before
CLASSES = 16  # at most this many classes (the last holds everything shorter)
OVERSHOOT = 0.5  # a merge may lift a rank above the busiest by this share of the micro-batches' cost it saves
_NO_ROOM = np.iinfo(np.int64).max


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


def merge(p: Placement) -> None:
    """Where a micro-batch costs (``per_micro_batch`` > 0), the deal in fewer micro-batches, the fastest found:
    the ``K`` that hold the most tokens kept (in their order), every document of the others moved into the kept
    ones' free room, ``K`` from the fewest the tokens need up, until a ``K`` leaves no rank above the busiest
    (more would not be faster). A split document moves to a kept micro-batch of its block (the fullest with
    room). The whole ones, longest first, are laid end to end over the ranks in proportion to each rank's
    room, in tokens (the kept micro-batches' free room; the time below the busiest rank's, at the moved
    documents' mean time per token), then into micro-batches by :func:`_runs`; what does not fit, by best fit
    (:func:`_best_fit`), up to :data:`OVERSHOOT` of the micro-batches' cost saved above the busiest rank. Where
    the time below the busiest rank is too short, once more with that much time on every rank."""
    M = p.micro_batches
    if p.per_mb <= 0 or M <= 1:
        return
    limit, before = float(p.load.max()), p.makespan()
    best: tuple[float, tuple[np.ndarray, ...]] | None = None
    fullest = np.argsort((p.room - p.cap).sum(axis=0), kind="stable")  # ties: the lower micro-batch
    for k in range(max(1, -(-int((p.share * p.degree).sum()) // (p.ranks * p.cap))), M):
        keep = np.sort(fullest[:k])
        spill = limit + OVERSHOOT * (M - k) * p.per_mb
        for budget in (limit, spill):
            saved = p.state()
            merged = _merged(p, keep, budget, spill)
            if merged and p.makespan() < (best[0] if best else before):
                best = (p.makespan(), p.state())
            p.restore(saved)
            if merged:
                break
        if best and best[0] <= limit + k * p.per_mb:
            break  # no rank above the busiest: more micro-batches would cost more
    if best:
        p.restore(best[1])


def _merged(p: Placement, keep: np.ndarray, budget: float, spill: float) -> bool:
    """Every document out of the micro-batches not in ``keep`` (sorted), those dropped (see :func:`merge`):
    the whole ones laid in proportion to the ranks' room below ``budget``, what does not fit up to ``spill``.
    False where some document found no room (the placement half changed: restore it)."""
    moving = np.flatnonzero(np.isin(p.mb, keep, invert=True))
    for j in moving[p.degree[moving] > 1].tolist():  # a block's ranks hold it in the same micro-batch
        d, f = int(p.degree[j]), int(p.first[j])
        free = p.room[f : f + d, keep].min(axis=0)
        fits = free >= p.share[j]
        if not fits.any():
            return False
        p.room[f : f + d, p.mb[j]] += p.share[j]
        p.mb[j] = keep[np.argmin(np.where(fits, free, _NO_ROOM))]
        p.room[f : f + d, p.mb[j]] -= p.share[j]
    whole = moving[p.degree[moving] == 1]
    whole = whole[np.argsort(-p.share[whole], kind="stable")]
    renumber = np.full(p.micro_batches, -1, np.int64)
    renumber[keep] = np.arange(len(keep))
    p.load = p.load - np.bincount(p.first[whole], weights=p.time[whole], minlength=p.ranks)
    p.room, p.mb = p.room[:, keep], renumber[p.mb]
    p.first[whole] = -1
    if not len(whole):
        return True
    s = p.share[whole]
    total, work = int(s.sum()), float(p.time[whole].sum())
    below = np.where(budget > p.load, (budget - p.load) * (total / work) if work > 0 else np.inf, 0.0)
    allow = np.minimum(p.room.sum(axis=1), below)
    if allow.sum() < total:
        return False
    edges = np.cumsum(allow * (total / allow.sum()))  # each rank's span: its room, in proportion
    return _best_fit(p, _runs(p, whole, _cut(edges, np.cumsum(s) - s / 2, p.ranks)), spill)


def _best_fit(p: Placement, docs: np.ndarray, limit: float) -> bool:
    """Whole documents ``docs``, each onto the least-loaded rank with room in some micro-batch where it leaves
    the rank at most at ``limit`` (in the fullest such micro-batch there); False where no rank is such."""
    most = p.room.max(axis=1)
    for j in docs.tolist():
        s, t = p.share[j], p.time[j]
        ok = (most >= s) & (p.load + t <= limit)
        if not ok.any():
            return False
        r = int(np.argmin(np.where(ok, p.load, np.inf)))
        row = p.room[r]
        m = int(np.argmin(np.where(row >= s, row, _NO_ROOM)))
        row[m] -= s
        most[r] = row.max()
        p.first[j], p.mb[j] = r, m
        p.load[r] += t
    return True


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
