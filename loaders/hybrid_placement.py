"""A hybrid deal under way (:func:`loaders.hybrid.deal`): the state of one step's placement and its phases,
blocks of split documents, LPT of the long whole ones (the short ones: :mod:`loaders.hybrid_fill`), the
refinement, and the result (see :mod:`loaders.hybrid` for the heuristic).

Two engines place the same documents on the same ranks and micro-batches, bit for bit: numpy (this module
and :mod:`loaders.hybrid_fill`), and the scalar kernels of :mod:`loaders.hybrid_kernels` (compiled by numba)
for the inner loops, LPT, a block's placement and the water-fill; the refinement, the merge of micro-batches
and the result are numpy's in both.
"""

from __future__ import annotations

import heapq

import numpy as np

from contract.cost import CostModel
from loaders.hybrid_fill import merge, water_fill
from loaders.hybrid_kernels import Kernels

__all__ = ["EXACT", "REFINE_ROUNDS", "SWAP_CANDIDATES", "TAIL_SHARE", "Placement"]

EXACT = 256  # whole documents up to this count are all placed by LPT (beyond: LPT for the long ones)
TAIL_SHARE = 16  # beyond EXACT, documents below 1/TAIL_SHARE of the mean rank time are water-filled
REFINE_ROUNDS = 16  # at most this many moves, swaps or splits after the deal
SWAP_CANDIDATES = 48  # a swap looks at this many whole documents of each of the two ranks
_NO_ROOM = np.iinfo(np.int64).max


class Placement:
    """One deal under way, in virtual rank space (relabelled by the seed at the end).

    Tokens are kept in units of ``1 / top`` token, so that a block's share ``l · top / d`` of a document
    is an exact int64. ``room`` int64 [W, M]: free room per rank and micro-batch; ``load`` float64 [W]:
    predicted time per rank so far (without ``per_micro_batch``); ``first``/``mb`` int64 [n]: each placed
    document's first (virtual) rank and micro-batch, -1 while unplaced."""

    def __init__(
        self,
        lens: np.ndarray,
        degree: np.ndarray,
        time: np.ndarray,
        ranks: int,
        capacity: int,
        gpus_per_node: int,
        cost: CostModel,
        micro_batches: int,
        kern: Kernels | None,
    ):
        self.kern = kern  # the compiled (or interpreted) kernels; None: numpy
        self.lens, self.cost, self.gpus_per_node = lens, cost, gpus_per_node
        self.ranks = ranks = int(ranks)
        self.top = top = 1 << (ranks.bit_length() - 1)  # the largest aligned block
        self.degree = degree.copy()  # a split in the refinement changes it
        self.cap = int(capacity) * top
        self.share = lens * (top // self.degree)
        self.time = time.copy()  # float64 [n]: per-rank time at ``degree``; a split in the refinement changes it
        self.per_mb = float(cost.per_micro_batch)
        n = len(lens)
        self.first = np.full(n, -1, np.int64)
        self.mb = np.full(n, -1, np.int64)
        self.load = np.zeros(self.ranks)
        self.room = np.full((self.ranks, micro_batches), self.cap, np.int64)
        self.unfit = 0  # whole documents :meth:`place` split before the whole ones were placed

    @property
    def micro_batches(self) -> int:
        return int(self.room.shape[1])

    def open_micro_batches(self, k: int = 1) -> int:
        """``k`` new micro-batches on every rank; the index of the first."""
        self.room = np.concatenate([self.room, np.full((self.ranks, k), self.cap, np.int64)], axis=1)
        return self.micro_batches - k

    def mean(self) -> float:
        """The mean rank time once every document is placed (without ``per_micro_batch``)."""
        return float((self.degree * self.time).sum()) / self.ranks

    def makespan(self) -> float:
        """The busiest rank's predicted time, ``per_micro_batch`` included."""
        return float(self.load.max()) + self.micro_batches * self.per_mb

    def state(self) -> tuple[np.ndarray, ...]:
        """A copy of what a placement changes (loads, room, blocks, micro-batches), for :meth:`restore`."""
        return self.load.copy(), self.room.copy(), self.first.copy(), self.mb.copy()

    def restore(self, state: tuple[np.ndarray, ...]) -> None:
        """Back to a :meth:`state` (which it takes over)."""
        self.load, self.room, self.first, self.mb = state

    # the phases ---------------------------------------------------------------------------------------------

    def place(self, split_unfit: bool = True) -> Placement:
        """Blocks, then whole documents (LPT for the long, water-filling for the short); no refinement.
        ``split_unfit``: first split the whole documents no rank can take without rising above the mean."""
        order = np.argsort(-self.time, kind="stable")  # longest per-rank time first, ties by index
        for j in order[self.degree[order] > 1].tolist():
            self.place_block(j)
        for _ in range(REFINE_ROUNDS):
            # blocks stacked above the mean rank time, which the whole documents fill up to: split further
            busiest = int(np.argmax(self.load))
            if self.load[busiest] <= self.mean() * (1 + 1e-6) or not self._split(busiest):
                break
        self.unfit = self._split_unfit(order[self.degree[order] == 1]) if split_unfit else 0
        whole = order[self.degree[order] == 1]
        if len(whole) <= EXACT:
            self.lpt(whole)
            return self
        mean = self.mean()
        exact = min(int(np.searchsorted(-self.time[whole], -mean / TAIL_SHARE, side="left")), EXACT)
        self.lpt(whole[:exact])
        water_fill(self, whole[exact:])
        return self

    def _split_unfit(self, whole: np.ndarray) -> int:
        """Split the whole documents (``whole``, longest first) that would lift even the least-loaded rank
        above the mean rank time (the blocks placed so far lie under every rank), each twice as far while it
        still would and that lowers its per-rank time, and place them as blocks: once the whole documents
        fill the ranks up to the mean, a split in the refinement finds no block with slack left. Returns how
        many it split."""
        for k in range(len(whole)):  # most steps stop at the first: no list of them all
            j = int(whole[k])
            d, t = 1, float(self.time[j])
            while d < self.top and t + float(self.load.min()) > self.mean() * (1 + 1e-6):
                t2 = float(np.asarray(self.cost.time(self.lens[j : j + 1], np.array([d * 2]), self.gpus_per_node))[0])
                if t2 >= t:
                    break  # communication outgrows the compute a split saves
                d, t = d * 2, t2
                self.degree[j], self.time[j], self.share[j] = d, t, self.lens[j] * (self.top // d)
            if d == 1:
                return k  # the rest are no longer, and the least load only rises as blocks are placed
            self.place_block(j)
        return len(whole)

    def place_block(self, j: int, allow_open: bool = True) -> bool:
        """Place split document ``j`` on the aligned block whose busiest rank is least loaded among those with
        a micro-batch that has room on all their ranks (the fullest such micro-batch); with no such block, in
        a new micro-batch on the least-loaded block (or not at all, False, unless ``allow_open``)."""
        d = int(self.degree[j])
        if self.kern is not None:
            self.room, placed = self.kern.block(
                self.load,
                self.room,
                self.first,
                self.mb,
                self.time,
                self.share,
                j,
                d,
                self.cap,
                self.per_mb,
                allow_open,
            )
            return bool(placed)
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
            b, m = lightest, self.open_micro_batches()
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

    def lpt(self, docs: np.ndarray) -> None:
        """Whole documents ``docs`` (longest first), each onto the least-loaded rank with room in some
        micro-batch (the first such); with room nowhere, a new micro-batch on every rank. Python ints and a
        heap: one numpy call per document would cost more than the work."""
        if not len(docs):
            return
        if self.kern is not None:
            self.room = self.kern.lpt(
                self.load, self.room, self.first, self.mb, self.time, self.share, docs, self.cap, self.per_mb
            )
            return
        room = self.room.tolist()
        most = [max(r) for r in room]
        loads = self.load.tolist()
        heap = [(ld, r) for r, ld in enumerate(loads)]  # lazy: an entry whose load is not the rank's is stale
        heapq.heapify(heap)
        cap, ranks, per_mb = self.cap, range(self.ranks), self.per_mb
        times, shares = self.time[docs].tolist(), self.share[docs].tolist()
        firsts, mbs = [0] * len(docs), [0] * len(docs)
        pop, push, replace = heapq.heappop, heapq.heappush, heapq.heapreplace
        for i, (t, s) in enumerate(zip(times, shares, strict=True)):
            ld, r = heap[0]
            while ld != loads[r]:
                pop(heap)
                ld, r = heap[0]
            top = True  # r is the heap's top: its new load replaces it
            if most[r] < s:  # the least-loaded rank is full: the least loaded of those with room, unless
                roomy = [(loads[q], q) for q in ranks if most[q] >= s]
                if roomy and min(roomy)[0] - ld <= per_mb:
                    (ld, r), top = min(roomy), False
                else:  # a new micro-batch on every rank costs less (or there is no room anywhere)
                    for free in room:
                        free.append(cap)
                    most = [cap] * len(room)
            row = room[r]
            m = 0
            while row[m] < s:
                m += 1
            row[m] -= s
            most[r] = max(row)
            firsts[i], mbs[i] = r, m
            loads[r] = ld = ld + t
            (replace if top else push)(heap, (ld, r))
        self.room = np.array(room, dtype=np.int64)
        self.first[docs] = firsts
        self.mb[docs] = mbs
        self.load = self.load + np.bincount(np.array(firsts), weights=self.time[docs], minlength=self.ranks)

    # refinement ----------------------------------------------------------------------------------------------

    def refine(self) -> Placement:
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
        self._drop_empty()
        merge(self)
        return self

    def _drop_empty(self) -> None:
        """Remove the micro-batches that no document uses on any rank (opened ahead by the water-fill, then
        not needed): each cost every rank ``per_micro_batch`` and a trainer an empty pass. The others keep
        their order, so a block's ranks still reach their documents in the same micro-batch."""
        used = np.zeros(self.micro_batches, dtype=bool)
        placed = self.mb >= 0
        used[self.mb[placed]] = True
        if used.all():
            return
        self.mb[placed] = (np.cumsum(used) - 1)[self.mb[placed]]
        self.room = self.room[:, used]

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
        before = max(float(self.load.max()), self.mean())  # whole documents still to place fill up to the mean
        held = held[np.argsort(-self.time[held], kind="stable")][:4]
        halved = np.asarray(self.cost.time(self.lens[held], self.degree[held] * 2, self.gpus_per_node))
        for j, t in zip(held.tolist(), halved.reshape(-1).tolist(), strict=True):
            old = (int(self.degree[j]), int(self.first[j]), int(self.mb[j]), self.time[j], self.share[j])
            d = old[0] * 2
            if t >= old[3]:
                continue
            self._take(j)
            self.degree[j], self.time[j], self.share[j] = d, t, self.lens[j] * (self.top // d)
            if self.place_block(j, allow_open=False) and max(float(self.load.max()), self.mean()) < before:
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
        for d in np.flatnonzero(np.bincount(self.degree)).tolist():  # the degrees present, ascending
            sel = self.degree == d
            blocks = self.ranks // d
            per_block = np.bincount(self.first[sel] // d, weights=self.time[sel], minlength=blocks)
            out[: blocks * d] += np.repeat(per_block, d)
        return out + self.micro_batches * self.per_mb

    def result(self, relabel: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """The deal's degrees, first ranks, micro-batches (int64 [n] each), rank times (float64 [W]) and
        micro-batches per rank, ranks relabelled ``v ↦ v XOR relabel`` (aligned blocks stay aligned)."""
        first = self.first ^ (relabel & ~(self.degree - 1))
        times = np.empty(self.ranks)
        times[np.arange(self.ranks) ^ relabel] = self._rank_time()
        return self.degree.copy(), first, self.mb.copy(), times, self.micro_batches
