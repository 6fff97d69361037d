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
3. **Whole documents**, longest first. Those that would lift even the least-loaded rank above the mean
   rank time (where blocks lie under every rank) are split twice as far while they still would (and that
   lowers their per-rank time) and placed as blocks: once the rest fill the ranks up to the mean, no block
   has slack left for a split. The long ones (all of them up to :data:`EXACT` documents, else those
   above 1/:data:`TAIL_SHARE` of the mean rank time, at most :data:`EXACT`) by LPT, each onto the
   least-loaded rank with room in some micro-batch (``O(E log W)``). The rest, short against a rank's
   share, by water-filling (``O(n log n)``, :mod:`loaders.hybrid_fill`), one class of per-rank time at a
   time (each :data:`CLASS_RATIO` times shorter than the one before): the ranks' shortfalls below the
   level the class fills to are laid end to end, and so are the class's documents; a rank takes those
   lying wholly within its shortfall (no rank rises above the level), the few that straddle two shortfalls
   (one per rank at most) go by LPT before the next, finer, class evens out what is left. Each rank's run
   is laid into its free room micro-batch after micro-batch (next fit); what does not fit goes in runs cut
   at the ranks' free room, then by LPT.
4. **Refinement** (at most :data:`REFINE_ROUNDS` rounds, ``O(n + W)`` each): while the busiest rank is
   above both the mean and the longest per-rank document time, move one of its whole documents to the
   least-loaded rank, swap one for a shorter one there, or split one of its longest documents twice as far
   onto the best aligned block, whichever first lowers the busiest of the ranks involved; stop when none
   does.

**Second deals.** Where step 3 split a whole document, the deal without that split as well, the faster kept
(a tie to the plain one). Where the busiest rank is above that bound with two or more split documents on it,
each split further than its least degree (more documents than blocks of their degree, stacked), the deal with
them half as far as well, kept if faster; at most :data:`HALVINGS` times, from the last such deal.

**Micro-batches.** A deal starts from the fewest micro-batches the tokens need, ``ceil(Σ l / (W ·
capacity))``. Where the least-loaded rank (block) has no room for a document, it goes to the least-loaded one
that has, unless that one is busier by more than ``per_micro_batch`` (or none has room): then a new
micro-batch opens on every rank, which costs each ``per_micro_batch``. The water-fill opens the micro-batches
its level needs beyond the ranks' room, unless (``per_micro_batch`` > 0) filling without them is faster (the
two fills are compared whole, where opening can win at all). At the default ``per_micro_batch`` of 0 a
micro-batch costs nothing the model sees, so the deal opens one whenever capacity stands in the way of the
balance. A micro-batch that no document ended up in on any rank (the water-fill opens them ahead of need) is
dropped at the end of each deal, the others keeping their order. Then (``per_micro_batch`` > 0) the deal in
fewer micro-batches where that is faster (:func:`loaders.hybrid_fill.merge`): the fullest ``K`` kept, the
others' documents moved into their free room (a split one within its block), the whole ones laid over the
ranks in proportion to their room in tokens and in time below the busiest rank (which a rank may pass by
:data:`OVERSHOOT` of the micro-batches' cost saved), ``K`` from the fewest the tokens need up. The water-fill
balances time, not tokens: on a step one long document bounds, it piles the short ones' tokens on the few
ranks the blocks leave light, in micro-batches the others do not need (the long-tailed S=131072 steps at
H200's constants, ``benchmarks/hybrid.py``: 4.63 micro-batches a step, 3.08 with the merge). A small step (at
most :data:`EXACT` documents) whose documents all fit one rank, some split for cost, is also dealt with no
document split and the faster deal kept; so a small step whose documents all fit one micro-batch of one rank is
never dealt worse than by LPT of whole documents.

**Engines.** The placement (:mod:`loaders.hybrid_placement`) runs its inner loops (LPT, a block's
placement, the water-fill) on numpy and Python by default (a training node needs no numba), or, opted in with
``engine="compiled"`` or ``WEIR_HYBRID_ENGINE=compiled`` where numba is installed, as numba-compiled kernels
(:mod:`loaders.hybrid_kernels`); both give the same deal, bit for bit, so the ranks of a job may mix them.

Determinism: only numpy and Python arithmetic in a fixed order, ties broken by rank then document index
(stable sorts), so every rank running the same numpy gets the same deal (numpy's float sums may differ in
the last bit between CPU instruction sets: keep the ranks of a job on one kind of node). ``seed`` relabels
ranks by ``g ↦ g XOR s`` (``s`` a hash of the seed below the largest power of two dividing ``W``), which
maps aligned blocks to aligned blocks: the deal's quality does not depend on it, but which ranks carry the
heaviest blocks changes from seed to seed (use the step as the seed).

Time (``benchmarks/hybrid_plan.py``): 1 M tokens per step (2,100 to 6,700 documents) over 64 ranks take 0.6
to 1.5 ms of CPU per step compiled, 1.0 to 2.7 ms on numpy (median over steps, one thread; p95 at most 2.6 and
3.5 ms), on a 2-core development machine under a load average of 2 to 4. The compiled engine's first deal in
a process imports numba and loads its kernels from numba's cache (about a second), or compiles them once (some
20 s).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract.cost import CostModel
from loaders.hybrid_fill import CLASS_RATIO, CLASSES, OVERSHOOT
from loaders.hybrid_kernels import ENGINES, default_engine, kernels
from loaders.hybrid_placement import EXACT, REFINE_ROUNDS, SWAP_CANDIDATES, TAIL_SHARE, Placement

HALVINGS = 3  # at most this many deals more, with the split documents stacked on the busiest rank half as far

__all__ = [
    "CLASSES",
    "CLASS_RATIO",
    "ENGINES",
    "EXACT",
    "HALVINGS",
    "OVERSHOOT",
    "REFINE_ROUNDS",
    "SWAP_CANDIDATES",
    "TAIL_SHARE",
    "Deal",
    "HybridWorld",
    "deal",
]


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


def deal(lengths: np.ndarray, world: HybridWorld, cost: CostModel, *, seed: int = 0, engine: str | None = None) -> Deal:
    """Deal a step's documents of ``lengths`` tokens (ints ≥ 1, [n]) to ``world``'s ranks (see the module's
    docstring for the heuristic). Deterministic: a function of the arguments only, whichever ``engine``
    (``"compiled"`` or ``"numpy"``; default :func:`loaders.hybrid_kernels.default_engine`) deals it.

    Raises ``ValueError`` for a length below 1 or a document longer than the largest aligned block holds
    (``D · capacity`` tokens, ``D`` the largest power of two ≤ ``dp · cp``).
    """
    lens = np.asarray(lengths)
    if lens.ndim != 1 or (lens.size and not np.issubdtype(lens.dtype, np.integer)):
        raise ValueError(f"lengths must be a 1-D array of ints, got {lens.dtype} of shape {lens.shape}")
    lens = lens.astype(np.int64)
    kern = kernels(engine or default_engine())
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
    least_time = _times(cost, lens, least, world.gpus_per_node)
    degree, time = _degrees(lens, least, least_time, world, cost, top)
    fewest = max(1, -(-int(lens.sum()) // (ranks * world.capacity)))  # no deal has fewer micro-batches
    shape = (ranks, world.capacity, world.gpus_per_node, cost, fewest, kern)
    best = Placement(lens, degree, time, *shape).place().refine()
    if best.unfit:  # the same degrees with no whole document split before the fill, so that it never loses
        plain = Placement(lens, degree, time, *shape).place(split_unfit=False).refine()
        if plain.makespan() <= best.makespan():
            best = plain
    halved, halved_time, last = degree, time, best
    for _ in range(HALVINGS):
        # split documents stacked on the busiest rank, each split for cost: the deal with them half as far, each
        # alone on a smaller block (more of them than the blocks of their degree would stack), as well
        stacked = _stacked(last, halved, least)
        if not len(stacked):
            break
        halved, halved_time = halved.copy(), halved_time.copy()
        halved[stacked] //= 2  # ≥ their least degree
        halved_time[stacked] = _times(cost, lens[stacked], halved[stacked], world.gpus_per_node)
        last = Placement(lens, halved, halved_time, *shape).place().refine()
        if last.makespan() < best.makespan():
            best = last
    if len(lens) <= EXACT and least.max() == 1 and np.any(degree != least):
        # every document fits one rank but some were split for cost: the deal that splits none as well, so that
        # a split never loses to not splitting
        whole = Placement(lens, least, least_time, *shape).place(split_unfit=False).refine()
        if whole.makespan() < best.makespan():
            best = whole
    return Deal(*best.result(_relabel(seed, ranks)))


# -- degrees -----------------------------------------------------------------------------------------------


def _pow2ceil(x: np.ndarray) -> np.ndarray:
    """int64: the least power of two ≥ each of ``x`` (ints ≥ 1)."""
    bits = np.frexp((x - 1).astype(np.float64))[1].astype(np.int64)  # bit length of x − 1
    return np.left_shift(np.int64(1), bits)


def _times(cost: CostModel, lens: np.ndarray, degree: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """float64 [n]: ``cost.time(lens, degree, gpus_per_node)``, bit for bit, with the communication terms
    evaluated only where ``degree > 1`` (they are 0 at degree 1, and most of a step's documents are whole)."""
    t = np.asarray(cost.compute(lens, degree), dtype=np.float64)
    split = np.flatnonzero(degree > 1)
    if len(split):
        t[split] = np.asarray(cost.time(lens[split], degree[split], gpus_per_node), dtype=np.float64)
    return t


def _degrees(
    lens: np.ndarray, least: np.ndarray, least_time: np.ndarray, world: HybridWorld, cost: CostModel, top: int
) -> tuple[np.ndarray, np.ndarray]:
    """int64 [n] and float64 [n]: each document's degree and per-rank time (``least_time``: at ``least``, its
    least, capacity, degree), split further while that lowers ``max(mean rank time, largest per-rank document
    time)``, a bound no deal beats."""
    gpn, ranks = world.gpus_per_node, world.size
    d, t = least, least_time
    bound = max(float((d * t).sum()) / ranks, float(t.max()))
    while True:
        mean = float((d * t).sum()) / ranks
        over = np.flatnonzero((t > mean) & (d < top))
        if not len(over):
            return d, t
        t2 = np.asarray(cost.time(lens[over], d[over] * 2, gpn), dtype=np.float64)
        gain = t2 < t[over]  # communication can outgrow the compute a split saves
        over, t2 = over[gain], t2[gain]
        if not len(over):
            return d, t
        d2, tt = d.copy(), t.copy()
        d2[over] *= 2
        tt[over] = t2
        bound2 = max(float((d2 * tt).sum()) / ranks, float(tt.max()))
        if bound2 >= bound:
            return d, t
        d, t, bound = d2, tt, bound2


def _stacked(p: Placement, degree: np.ndarray, least: np.ndarray) -> np.ndarray:
    """int64: the split documents on ``p``'s busiest rank, where it is above the bound no deal beats, at the
    degrees ``p`` was dealt (``degree``) and further than their least; empty unless two or more."""
    busiest = int(np.argmax(p.load))
    if p.load[busiest] <= max(p.mean(), float(p.time.max())) * (1 + 1e-6):
        return np.zeros(0, np.int64)
    on = (p.first <= busiest) & (busiest < p.first + p.degree)
    held = np.flatnonzero(on & (p.degree == degree) & (degree > least))
    return held if len(held) >= 2 else np.zeros(0, np.int64)


def _relabel(seed: int, ranks: int) -> int:
    """A hash of ``seed`` (splitmix64) below the largest power of two dividing ``ranks``."""
    z = (int(seed) + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    z ^= z >> 31
    return z & ((ranks & -ranks) - 1)
