"""The hybrid data-parallel deal: a step's documents dealt to the ``dp × cp`` ranks, each whole on one rank
or split over an aligned block of ``d = 2^k`` ranks, so that every rank's predicted time is even.

ByteScale's hybrid data parallelism (also Hydraulis, FlexSP; Megatron-core's dynamic context parallelism
does it online, with a collective) planned offline: :func:`deal` is a function of the step's document
lengths, the world, the cost model and a seed, so every rank computes the same deal and no rank waits for
another to learn it. A document that fits a rank's ``capacity`` of tokens per micro-batch stays whole on one
rank (no CP communication); a longer one, or one whose time alone would exceed a rank's fair share, is split
over an aligned block of ``d`` ranks (``first_rank % d == 0``), each rank holding ``l / d`` of its tokens in
the same micro-batch. A rank's predicted time is :meth:`contract.cost.CostModel.time` summed over the
documents it holds (a block's document counts on each of its ranks), plus ``per_micro_batch`` per
micro-batch; every rank runs the same number of micro-batches.

The heuristic, for ``n`` documents on ``W`` ranks in ``M`` micro-batches, ``D`` the largest power of two
``≤ W``:

1. **Degrees** (vectorized, ``O(n log D)``): each document's least degree ``ceil(l / capacity)`` rounded
   up to a power of two; then, while it lowers the bound ``max(mean rank time, largest per-rank document
   time)``, every document whose per-rank time exceeds the mean is split twice as far (where that lowers its
   own per-rank time: communication grows with ``d``).
2. **Blocks** (``O(B · W · M)`` for ``B`` split documents), longest per-rank time first: onto the aligned
   block whose busiest rank is least loaded among those with a micro-batch that has room on all its ranks
   (the fullest such micro-batch). While a stack of blocks rises above the mean rank time (which the whole
   documents fill up to), one of its longest documents is split twice as far where that lowers the stack.
3. **Whole documents**, longest first. The long ones (all of them up to :data:`EXACT` documents, else those
   above 1/:data:`TAIL_SHARE` of the mean rank time, at most :data:`EXACT`) by LPT, each onto the
   least-loaded rank with room in some micro-batch (``O(E log W)``, Python). The rest, short against a
   rank's share, by water-filling (``O(n log n)``, vectorized), one class of per-rank time at a time (each
   :data:`CLASS_RATIO` times shorter than the one before): the ranks' shortfalls below the level the class
   fills to are laid end to end, and so are the class's documents; a rank takes those lying wholly within
   its shortfall (no rank rises above the level), the few that straddle two shortfalls (one per rank at
   most) go by LPT before the next, finer, class evens out what is left. Each rank's run is laid into its
   free room micro-batch after micro-batch (next fit); what does not fit goes in runs cut at the ranks'
   free room, then by LPT.
4. **Refinement** (at most :data:`REFINE_ROUNDS` rounds, ``O(n + W)`` each): while the busiest rank is
   above both the mean and the longest per-rank document time, move one of its whole documents to the
   least-loaded rank, swap one for a shorter one there, or split one of its longest documents twice as far
   onto the best aligned block, whichever first lowers the busiest of the ranks involved; stop when none
   does.

**Micro-batches.** A deal starts from the fewest micro-batches the tokens need, ``ceil(Σ l / (W ·
capacity))``. Where the least-loaded rank (block) has no room for a document, it goes to the least-loaded one
that has, unless that one is busier by more than ``per_micro_batch`` (or none has room): then a new
micro-batch opens on every rank, which costs each ``per_micro_batch``. The water-fill opens the micro-batches
its level needs beyond the ranks' room, unless (``per_micro_batch`` > 0) filling without them is faster (the
two fills are compared whole, where opening can win at all). At the default ``per_micro_batch`` of 0 a
micro-batch costs nothing the model sees, so the deal opens one whenever capacity stands in the way of the
balance. A small step (at most :data:`EXACT` documents) whose documents all fit one rank, some split for
cost, is also dealt with no document split and the faster deal kept; so a small step whose documents all fit
one micro-batch of one rank is never dealt worse than by LPT of whole documents.

Determinism: only numpy and Python arithmetic in a fixed order, ties broken by rank then document index
(stable sorts), so every rank running the same numpy gets the same deal (numpy's float sums may differ in
the last bit between CPU instruction sets: keep the ranks of a job on one kind of node). ``seed`` relabels
ranks by ``g ↦ g XOR s`` (``s`` a hash of the seed below the largest power of two dividing ``W``), which
maps aligned blocks to aligned blocks: the deal's quality does not depend on it, but which ranks carry the
heaviest blocks changes from seed to seed (use the step as the seed).

Time: 1 M tokens per step (770 to 6,200 documents) over 64 ranks take 1.1 to 4.5 ms of CPU per step (median
over steps, numpy only), measured on a 2-core development machine under a load average of 5 to 7.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from contract.cost import CostModel

__all__ = [
    "CLASSES",
    "CLASS_RATIO",
    "EXACT",
    "REFINE_ROUNDS",
    "SWAP_CANDIDATES",
    "TAIL_SHARE",
    "Deal",
    "HybridWorld",
    "deal",
]

EXACT = 256  # whole documents up to this count are all placed by LPT (beyond: LPT for the long ones)
TAIL_SHARE = 16  # beyond EXACT, documents below 1/TAIL_SHARE of the mean rank time are water-filled
REFINE_ROUNDS = 16  # at most this many moves, swaps or splits after the deal
CLASS_RATIO = 32  # the water-fill's classes of per-rank time: each this many times shorter than the one before
CLASSES = 16  # at most this many classes (the last holds everything shorter)
SWAP_CANDIDATES = 48  # a swap looks at this many whole documents of each of the two ranks
_NO_ROOM = np.iinfo(np.int64).max


@dataclass(frozen=True)
class HybridWorld:
    """The ranks a step is dealt to: ``dp × cp`` global ranks ``g`` in ``[0, dp·cp)``, nodes of
    ``gpus_per_node`` consecutive ranks (a power of two keeps every aligned block of ``d ≤ gpus_per_node``
    inside one node). ``capacity``: tokens one rank holds in one micro-batch (its memory bound)."""

    dp: int
    cp: int
    capacity: int
    gpus_per_node: int = 8

    def __post_init__(self) -> None:
        for name in ("dp", "cp", "capacity", "gpus_per_node"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
                raise ValueError(f"HybridWorld.{name} is {value!r}; expected an int ≥ 1")

    @property
    def size(self) -> int:
        """``dp · cp``: the ranks a step is dealt to."""
        return self.dp * self.cp


@dataclass(frozen=True, eq=False)
class Deal:
    """One step's deal of ``n`` documents to ``W`` ranks.

    ``degree`` int64 [n]: each document's CP degree ``d`` (a power of two; 1: whole on one rank);
    ``first_rank`` int64 [n]: the first global rank of its aligned block (``first_rank % degree == 0``;
    the block is ``first_rank … first_rank + degree − 1``); ``micro_batch`` int64 [n]: the micro-batch it is
    in, on every rank of its block; ``rank_time`` float64 [W]: each rank's predicted time in cost units
    (Σ compute + comm of what it holds, plus ``per_micro_batch`` per micro-batch); ``micro_batches``: how
    many micro-batches every rank runs (0 for a step of no documents).
    """

    degree: np.ndarray
    first_rank: np.ndarray
    micro_batch: np.ndarray
    rank_time: np.ndarray
    micro_batches: int

    @property
    def compute_imbalance(self) -> float:
        """max over ranks of predicted time ÷ mean over ranks (1.0 is perfect; 1.0 for an empty step)."""
        mean = float(self.rank_time.mean()) if len(self.rank_time) else 0.0
        return float(self.rank_time.max()) / mean if mean > 0 else 1.0

    def rank_documents(self, rank: int) -> list[np.ndarray]:
        """Per micro-batch (``micro_batches`` of them), the indices (int64) of the documents ``rank`` holds a
        part of, ordered by degree descending then index: one total order, so the ranks of a block meet its
        documents in the same order."""
        if not 0 <= rank < len(self.rank_time):
            raise ValueError(f"rank {rank} is outside the world of {len(self.rank_time)} ranks")
        held = np.flatnonzero((self.first_rank <= rank) & (rank < self.first_rank + self.degree))
        held = held[np.lexsort((held, -self.degree[held], self.micro_batch[held]))]
        cuts = np.searchsorted(self.micro_batch[held], np.arange(1, self.micro_batches))
        return [np.asarray(part, dtype=np.int64) for part in np.split(held, cuts)] if self.micro_batches else []


def deal(lengths: np.ndarray, world: HybridWorld, cost: CostModel, *, seed: int = 0) -> Deal:
    """Deal a step's documents of ``lengths`` tokens (ints ≥ 1, [n]) to ``world``'s ranks (see the module's
    docstring for the heuristic). Deterministic: a function of the arguments only.

    Raises ``ValueError`` for a length below 1 or a document longer than the largest aligned block holds
    (``D · capacity`` tokens, ``D`` the largest power of two ≤ ``dp · cp``).
    """
    lens = np.asarray(lengths)
    if lens.ndim != 1 or (lens.size and not np.issubdtype(lens.dtype, np.integer)):
        raise ValueError(f"lengths must be a 1-D array of ints, got {lens.dtype} of shape {lens.shape}")
    lens = lens.astype(np.int64)
    ranks = world.size
    if lens.size == 0:
        empty = np.zeros(0, np.int64)
        return Deal(empty, empty.copy(), empty.copy(), np.zeros(ranks), 0)
    if lens.min() < 1:
        raise ValueError(f"a document of {int(lens.min())} tokens; every document holds at least 1")
    top = 1 << (ranks.bit_length() - 1)  # the largest aligned block
    least = _pow2ceil(-(-lens // world.capacity))
    if least.max() > top:
        j = int(np.argmax(least))
        raise ValueError(
            f"a document of {int(lens[j])} tokens needs {int(least[j])} ranks of {world.capacity} tokens; "
            f"the largest aligned block of {ranks} ranks has {top}"
        )
    degree = _degrees(lens, least, world, cost, top)
    fewest = max(1, -(-int(lens.sum()) // (ranks * world.capacity)))  # no deal has fewer micro-batches
    best = _Placement(lens, degree, world, cost, top, fewest).place().refine()
    if len(lens) <= EXACT and least.max() == 1 and np.any(degree != least):
        # every document fits one rank but some were split for cost: the deal that splits none as well, so that
        # a split never loses to not splitting
        whole = _Placement(lens, least, world, cost, top, fewest).place().refine()
        if whole.makespan() < best.makespan():
            best = whole
    return best.result(_relabel(seed, ranks))


# -- degrees -----------------------------------------------------------------------------------------------


def _pow2ceil(x: np.ndarray) -> np.ndarray:
    """int64: the least power of two ≥ each of ``x`` (ints ≥ 1)."""
    bits = np.frexp((x - 1).astype(np.float64))[1].astype(np.int64)  # bit length of x − 1
    return np.left_shift(np.int64(1), bits)


def _degrees(lens: np.ndarray, least: np.ndarray, world: HybridWorld, cost: CostModel, top: int) -> np.ndarray:
    """int64 [n]: each document's degree, from its least (capacity) degree, split further while that lowers
    ``max(mean rank time, largest per-rank document time)``, a bound no deal beats."""
    gpn, ranks = world.gpus_per_node, world.size
    d = least.copy()
    t = np.asarray(cost.time(lens, d, gpn), dtype=np.float64)
    bound = max(float((d * t).sum()) / ranks, float(t.max()))
    while True:
        mean = float((d * t).sum()) / ranks
        over = np.flatnonzero((t > mean) & (d < top))
        if not len(over):
            return d
        t2 = np.asarray(cost.time(lens[over], d[over] * 2, gpn), dtype=np.float64)
        gain = t2 < t[over]  # communication can outgrow the compute a split saves
        over, t2 = over[gain], t2[gain]
        if not len(over):
            return d
        d2, tt = d.copy(), t.copy()
        d2[over] *= 2
        tt[over] = t2
        bound2 = max(float((d2 * tt).sum()) / ranks, float(tt.max()))
        if bound2 >= bound:
            return d
        d, t, bound = d2, tt, bound2


# -- placement ----------------------------------------------------------------------------------------------


class _Placement:
    """One deal under way, in virtual rank space (relabelled by the seed at the end).

    Tokens are kept in units of ``1 / top`` token, so that a block's share ``l · top / d`` of a document
    is an exact int64. ``room`` int64 [W, M]: free room per rank and micro-batch; ``load`` float64 [W]:
    predicted time per rank so far (without ``per_micro_batch``); ``first``/``mb`` int64 [n]: each placed
    document's first (virtual) rank and micro-batch, -1 while unplaced."""

    def __init__(
        self, lens: np.ndarray, degree: np.ndarray, world: HybridWorld, cost: CostModel, top: int, micro_batches: int
    ):
        self.lens, self.world, self.cost, self.top = lens, world, cost, top
        self.degree = degree.copy()  # a split in the refinement changes it
        self.ranks = world.size
        self.cap = world.capacity * top
        self.share = lens * (top // self.degree)
        self.time = np.asarray(cost.time(lens, self.degree, world.gpus_per_node), dtype=np.float64)
        self.per_mb = cost.per_micro_batch
        n = len(lens)
        self.first = np.full(n, -1, np.int64)
        self.mb = np.full(n, -1, np.int64)
        self.load = np.zeros(self.ranks)
        self.room = np.full((self.ranks, micro_batches), self.cap, np.int64)

    @property
    def micro_batches(self) -> int:
        return int(self.room.shape[1])

    def _open(self, k: int = 1) -> int:
        """``k`` new micro-batches on every rank; the index of the first."""
        self.room = np.concatenate([self.room, np.full((self.ranks, k), self.cap, np.int64)], axis=1)
        return self.micro_batches - k

    def _mean(self) -> float:
        """The mean rank time once every document is placed (without ``per_micro_batch``)."""
        return float((self.degree * self.time).sum()) / self.ranks

    def makespan(self) -> float:
        """The busiest rank's predicted time, ``per_micro_batch`` included."""
        return float(self.load.max()) + self.micro_batches * self.per_mb

    def _state(self) -> tuple[np.ndarray, ...]:
        return self.load.copy(), self.room.copy(), self.first.copy(), self.mb.copy()

    def _restore(self, state: tuple[np.ndarray, ...]) -> None:
        self.load, self.room, self.first, self.mb = state

    # the phases ---------------------------------------------------------------------------------------------

    def place(self) -> _Placement:
        """Blocks, then whole documents (LPT for the long, water-filling for the short); no refinement."""
        order = np.argsort(-self.time, kind="stable")  # longest per-rank time first, ties by index
        for j in order[self.degree[order] > 1].tolist():
            self._place_block(j)
        for _ in range(REFINE_ROUNDS):
            # blocks stacked above the mean rank time, which the whole documents fill up to: split further
            busiest = int(np.argmax(self.load))
            if self.load[busiest] <= self._mean() * (1 + 1e-6) or not self._split(busiest):
                break
        whole = order[self.degree[order] == 1]
        if len(whole) <= EXACT:
            self._lpt(whole)
            return self
        mean = self._mean()
        exact = min(int(np.searchsorted(-self.time[whole], -mean / TAIL_SHARE, side="left")), EXACT)
        self._lpt(whole[:exact])
        self._water_fill(whole[exact:])
        return self

    def _place_block(self, j: int, allow_open: bool = True) -> bool:
        """Place split document ``j`` on the aligned block whose busiest rank is least loaded among those with
        a micro-batch that has room on all their ranks (the fullest such micro-batch); with no such block, in
        a new micro-batch on the least-loaded block (or not at all, False, unless ``allow_open``)."""
        d = int(self.degree[j])
        blocks = self.ranks // d
        span = blocks * d
        busiest = self.load[:span].reshape(blocks, d).max(axis=1)
        free = self.room[:span].reshape(blocks, d, -1).min(axis=1)  # [blocks, M]
        fits = free >= self.share[j]
        ok = fits.any(axis=1)
        lightest = int(np.argmin(busiest))
        b = int(np.argmin(np.where(ok, busiest, np.inf))) if ok.any() else lightest
        if ok.any() and (busiest[b] - busiest[lightest] <= self.per_mb or not allow_open):
            m = int(np.argmin(np.where(fits[b], free[b], _NO_ROOM)))
        elif allow_open:  # a new micro-batch on every rank costs less than a busier block (or nothing has room)
            b, m = lightest, self._open()
        else:
            return False
        self._put(j, b * d, m)
        return True

    def _put(self, j: int, first: int, m: int) -> None:
        d = int(self.degree[j])
        self.first[j], self.mb[j] = first, m
        self.load[first : first + d] += self.time[j]
        self.room[first : first + d, m] -= self.share[j]

    def _take(self, j: int) -> None:
        d, first, m = int(self.degree[j]), int(self.first[j]), int(self.mb[j])
        self.load[first : first + d] -= self.time[j]
        self.room[first : first + d, m] += self.share[j]
        self.first[j] = self.mb[j] = -1

    def _lpt(self, docs: np.ndarray) -> None:
        """Whole documents ``docs`` (longest first), each onto the least-loaded rank with room in some
        micro-batch (the first such); with room nowhere, a new micro-batch on every rank. Python ints and a
        heap: one numpy call per document would cost more than the work."""
        if not len(docs):
            return
        room = self.room.tolist()
        most = [max(r) for r in room]
        loads = self.load.tolist()
        heap = [(ld, r) for r, ld in enumerate(loads)]  # lazy: an entry whose load is not the rank's is stale
        heapq.heapify(heap)
        cap, ranks, per_mb = self.cap, range(self.ranks), self.per_mb
        times, shares = self.time[docs].tolist(), self.share[docs].tolist()
        firsts, mbs = [0] * len(docs), [0] * len(docs)
        for i in range(len(docs)):
            t, s = times[i], shares[i]
            while heap[0][0] != loads[heap[0][1]]:
                heapq.heappop(heap)
            ld, r = heap[0]
            if most[r] < s:  # the least-loaded rank is full: the least loaded of those with room, unless
                roomy = [(loads[q], q) for q in ranks if most[q] >= s]
                if roomy and min(roomy)[0] - ld <= per_mb:
                    ld, r = min(roomy)
                else:  # a new micro-batch on every rank costs less (or there is no room anywhere)
                    for free in room:
                        free.append(cap)
                    most = [cap] * len(room)
            row = room[r]
            m = next(k for k, x in enumerate(row) if x >= s)
            row[m] -= s
            most[r] = max(row)
            firsts[i], mbs[i] = r, m
            loads[r] = ld + t
            heapq.heappush(heap, (loads[r], r))
        self.room = np.array(room, dtype=np.int64)
        self.first[docs] = firsts
        self.mb[docs] = mbs
        self.load = self.load + np.bincount(np.array(firsts), weights=self.time[docs], minlength=self.ranks)

    def _water_fill(self, docs: np.ndarray) -> None:
        """Short whole documents ``docs`` (longest first) by water-filling, one class of per-rank time at a
        time (each :data:`CLASS_RATIO` times shorter than the one before), so that what a pass leaves uneven
        the next, finer, pass evens out. Where the level needs more room than the micro-batches have, a pass
        opens what it needs, unless (``per_micro_batch`` > 0) filling without them is faster; the two are
        compared over the whole fill."""
        t = self.time[docs]
        ratio = np.maximum(t[0], 1e-300) / np.maximum(t, 1e-300)
        cls = np.minimum(np.log(ratio) // np.log(CLASS_RATIO), CLASSES - 1).astype(np.int64)
        classes = [c for c in np.split(docs, np.searchsorted(cls, np.arange(1, CLASSES))) if len(c)]
        if self.per_mb <= 0:
            self._classes(classes, widen=True)
            return
        before, M = self._state(), self.micro_batches
        self._classes(classes, widen=False)
        # more micro-batches cost every rank per_micro_batch each: a fill that opens one cannot beat the mean, nor
        # the busiest rank before the fill, plus one more of them; it is tried only where this fill is slower
        floor = max(self._mean(), float(before[0].max()))
        if self.makespan() > floor + (M + 1) * self.per_mb:
            plain, plain_time = self._state(), self.makespan()
            self._restore(before)
            self._classes(classes, widen=True)
            if plain_time <= self.makespan():
                self._restore(plain)

    def _classes(self, classes: list[np.ndarray], widen: bool) -> None:
        for part in classes:
            # what straddled two shortfalls (a document per rank at most), longer than what follows, first
            self._lpt(self._fill(part, widen))

    def _fill(self, docs: np.ndarray, widen: bool) -> np.ndarray:
        """One pass of the water-fill. The ranks' shortfalls below the level ``docs`` fill to are laid end to
        end, and so are the documents; a rank takes the documents that lie wholly within its shortfall, so no
        rank rises above the level, and those that straddle two shortfalls (one per rank at most) are
        returned, for the next, finer, pass. Before the runs are laid into the ranks' room (:meth:`_runs`),
        ``widen`` opens the micro-batches they need; what does not fit its rank's room goes in runs cut at the
        ranks' free room, and what still does not fit (a document at a micro-batch's end), by :meth:`_lpt`."""
        pending = carried = docs[:0]
        if len(docs):
            t = self.time[docs]
            edges = np.cumsum(np.maximum(_water_level(self.load, float(t.sum())) - self.load, 0.0))
            end = np.cumsum(t)
            rank = np.searchsorted(edges, end - t, side="right")  # the shortfall each document starts in
            inside = rank < self.ranks
            inside[inside] = end[inside] <= edges[rank[inside]] * (1 + 1e-12)
            carried, docs, rank = docs[~inside], docs[inside], rank[inside]
            pending = self._runs(docs, self._widen(docs, rank, widen))
        for _ in range(3):
            if not len(pending):
                break
            s = self.share[pending]
            pending = self._runs(pending, _cut(np.cumsum(self.room.sum(axis=1)), np.cumsum(s) - s / 2, self.ranks))
            need = int(self.share[pending].sum()) - int(self.room.sum())
            if need <= 0:
                break
            self._open(-(-need // (self.ranks * self.cap)))  # capacity is short everywhere
        self._lpt(pending)
        return carried

    def _widen(self, docs: np.ndarray, rank: np.ndarray, widen: bool) -> np.ndarray:
        """``rank``, after opening (when ``widen``) the micro-batches that the runs of ``docs`` to ``rank``
        need beyond the ranks' free room."""
        if widen and len(docs):
            s = self.share[docs]
            short = int((np.bincount(rank, weights=s, minlength=self.ranks) - self.room.sum(axis=1)).max())
            if short > 0:  # a run leaves about a document's room unused at each micro-batch's end
                self._open(-(-(short + int(s.mean()) * self.micro_batches) // self.cap))
        return rank

    def _runs(self, docs: np.ndarray, rank: np.ndarray) -> np.ndarray:
        """Lay ``docs`` into the ranks ``rank`` (nondecreasing: each rank a run of consecutive documents),
        each run into its rank's free room micro-batch after micro-batch (next fit: a document that would
        cross a micro-batch's end starts the next one). Returns the documents that did not fit, in order."""
        n, ranks = len(docs), self.ranks
        s = self.share[docs]
        run = np.searchsorted(rank, np.arange(ranks), side="left")  # each rank's first document
        has = run < n
        end = np.cumsum(s)
        base = np.zeros(ranks, np.int64)
        base[has] = end[run[has]] - s[run[has]]
        pos = end - s - base[rank]  # where each document starts in its rank's free room laid end to end
        bounds = np.cumsum(self.room, axis=1)  # [W, M]: where each micro-batch's free room ends
        M = self.micro_batches
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
        self.first[placed] = rank[fit]
        self.mb[placed] = mb[fit]
        self.load += np.bincount(rank[fit], weights=self.time[placed], minlength=ranks)
        np.subtract.at(self.room, (rank[fit], mb[fit]), s[fit])
        return docs[~fit]

    # refinement ----------------------------------------------------------------------------------------------

    def refine(self) -> _Placement:
        """At most :data:`REFINE_ROUNDS` moves, swaps or splits off the busiest rank (see the module)."""
        for _ in range(REFINE_ROUNDS):
            busiest = int(np.argmax(self.load))
            # no deal beats the mean rank time or the longest per-rank document time
            floor = max(float(self.load.mean()), float(self.time.max()))
            if self.load[busiest] <= floor * (1 + 1e-6):
                break
            whole = self._whole(busiest)
            if not (self._move(busiest, whole) or self._swap(busiest, whole) or self._split(busiest)):
                break
        return self

    def _whole(self, rank: int) -> np.ndarray:
        """The whole documents on ``rank``."""
        return np.flatnonzero((self.first == rank) & (self.degree == 1))

    def _move(self, src: int, held: np.ndarray) -> bool:
        """Move one whole document of ``src`` to the least-loaded rank, the one that brings the two closest
        to even, in the fullest micro-batch there that has room."""
        dst = int(np.argmin(self.load))
        gap = self.load[src] - self.load[dst]
        t = self.time[held]
        ok = (t > 0) & (t < gap) & (self.share[held] <= self.room[dst].max())
        if not ok.any():
            return False
        j = int(held[np.argmin(np.where(ok, np.abs(gap / 2 - t), np.inf))])
        m = int(np.argmin(np.where(self.room[dst] >= self.share[j], self.room[dst], _NO_ROOM)))
        self._take(j)
        self._put(j, dst, m)
        return True

    def _swap(self, src: int, held: np.ndarray) -> bool:
        """Swap a whole document of ``src`` for a shorter whole one of the least-loaded rank, each into the
        other's micro-batch, the pair that brings the two closest to even."""
        dst = int(np.argmin(self.load))
        gap = self.load[src] - self.load[dst]
        mine, theirs = self._spread(held), self._spread(self._whole(dst))
        if gap <= 0 or not len(mine) or not len(theirs):
            return False
        delta = self.time[mine][:, None] - self.time[theirs][None, :]
        sa, sb = self.share[mine][:, None], self.share[theirs][None, :]
        room_dst = self.room[dst, self.mb[theirs]][None, :] + sb  # b's micro-batch on dst, without b
        room_src = self.room[src, self.mb[mine]][:, None] + sa
        ok = (delta > 0) & (delta < gap) & (sa <= room_dst) & (sb <= room_src)
        if not ok.any():
            return False
        flat = int(np.argmin(np.where(ok, np.abs(gap / 2 - delta), np.inf)))
        a, b = int(mine[flat // len(theirs)]), int(theirs[flat % len(theirs)])
        ma, mb = int(self.mb[a]), int(self.mb[b])
        self._take(a)
        self._take(b)
        self._put(a, dst, mb)
        self._put(b, src, ma)
        return True

    def _spread(self, held: np.ndarray) -> np.ndarray:
        """At most :data:`SWAP_CANDIDATES` of ``held``, evenly spread over their per-rank times (a swap needs
        a range of differences, not every pair)."""
        if len(held) <= SWAP_CANDIDATES:
            return held
        held = held[np.argsort(self.time[held], kind="stable")]
        return held[np.linspace(0, len(held) - 1, SWAP_CANDIDATES).astype(np.int64)]

    def _split(self, src: int) -> bool:
        """Split one of the few longest documents of ``src`` (per-rank time) twice as far, onto the best
        aligned block with room, when that lowers the busiest rank."""
        held = np.flatnonzero((self.first <= src) & (src < self.first + self.degree) & (self.degree < self.top))
        before = max(float(self.load.max()), self._mean())  # whole documents still to place fill up to the mean
        held = held[np.argsort(-self.time[held], kind="stable")][:4]
        halved = np.asarray(self.cost.time(self.lens[held], self.degree[held] * 2, self.world.gpus_per_node))
        for j, t in zip(held.tolist(), halved.reshape(-1).tolist(), strict=True):
            old = (int(self.degree[j]), int(self.first[j]), int(self.mb[j]), self.time[j], self.share[j])
            d = old[0] * 2
            if t >= old[3]:
                continue
            self._take(j)
            self.degree[j], self.time[j], self.share[j] = d, t, self.lens[j] * (self.top // d)
            if self._place_block(j, allow_open=False) and max(float(self.load.max()), self._mean()) < before:
                return True
            if self.first[j] >= 0:
                self._take(j)
            self.degree[j], self.time[j], self.share[j] = old[0], old[3], old[4]
            self._put(j, old[1], old[2])
        return False

    # the result ---------------------------------------------------------------------------------------------

    def _rank_time(self) -> np.ndarray:
        """float64 [W]: Σ per-rank time of what each rank holds, summed afresh per degree in document order
        (no drift from the incremental loads), plus ``per_micro_batch`` per micro-batch."""
        out = np.zeros(self.ranks)
        for d in np.unique(self.degree).tolist():
            sel = self.degree == d
            blocks = self.ranks // d
            per_block = np.bincount(self.first[sel] // d, weights=self.time[sel], minlength=blocks)
            out[: blocks * d] += np.repeat(per_block, d)
        return out + self.micro_batches * self.per_mb

    def result(self, relabel: int) -> Deal:
        """The :class:`Deal`, ranks relabelled ``v ↦ v XOR relabel`` (aligned blocks stay aligned)."""
        first = self.first ^ (relabel & ~(self.degree - 1))
        times = np.empty(self.ranks)
        times[np.arange(self.ranks) ^ relabel] = self._rank_time()
        return Deal(self.degree.copy(), first, self.mb.copy(), times, self.micro_batches)


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


def _relabel(seed: int, ranks: int) -> int:
    """A hash of ``seed`` (splitmix64) below the largest power of two dividing ``ranks``."""
    z = (int(seed) + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z & ((ranks & -ranks) - 1)
