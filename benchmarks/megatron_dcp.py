"""Megatron-core's dynamic context-parallel scheduler (``DefaultDynamicCPScheduler``), re-implemented for
``benchmarks/hybrid.py``: which documents of a global batch each DP×CP rank trains in each micro-batch, and
what its run-time rescheduling moves between ranks to get them there.

Read from NVIDIA/Megatron-LM, branch ``dev`` at commit d48bd6be0a85cc0d6d3cc71e8750cf357cc6bdb1 (2026-08-21):
``megatron/core/datasets/data_schedule.py`` (``DefaultDynamicCPScheduler.get_groups_and_subsamples`` and the
``run`` it inherits from ``DpBalancedScheduler``) and ``megatron/core/datasets/data_schedule_utils.py``
(``next_hdp_group_packing_aware``, ``dcp_gpus_needed``, ``_get_global_seqlens_and_ids``,
``reroute_samples_to_dcp_ranks``); the aligned CP sub-groups a micro-batch may use are those of
``create_dynamic_dp_cp_groups`` in ``megatron/core/parallel_state.py``. The grouping algorithm is the same at
d2e7ec5b889169d86919ea884e9c7e88a0f25f42 (2026-06-27, where it was introduced as the improved default). The
rerouting is counted as it was at 3f49de20de81c1ad5dfc10efa0f7d0c8098f1ce4 (2026-08-19): one
``all_to_all_single`` over the DP×CP group per data field; d48bd6be replaced it by one ``all_gather`` per field
inside each DP group, which :func:`traffic` counts as well (``bytes_allgather``).

What the scheduler does (written here from its behaviour, in this module's own terms and code):

1. Every DP rank loads its share of the global batch; the lengths are all-gathered inside the DP group (a
   count, then the lengths padded to the largest count) so that every rank schedules the same documents.
2. Documents are sorted longest first and micro-batches are formed one after another from what is left:

   a. the longest document opens a CP block of ``c_min(l) = max(min_cp, 2^ceil(log2(l / m)))`` ranks at rank
      0 (``m`` = ``max_seqlen_per_dp_cp_rank``), each rank of it taking the workload ``l² / c``;
   b. each later document tries every power of two ``c`` from ``c_min(l)`` to the world: joining an open block
      of ``c`` ranks whose tokens per rank (Σ ``l / c``) stay within ``m``, or opening a block on the ``c``
      lowest free ranks. A choice is judged by the largest workload of any rank after it; it must stay within
      ``cap = l_tall · m · 1.05`` (``l_tall`` the micro-batch's first document) and the smallest wins, the
      first found on a tie (smaller ``c`` first; for one ``c``, joining before opening, older blocks first).
      A document with no admissible choice waits for a later micro-batch;
   c. while a rank is left empty, the first block of the smallest size doubles (the ranks after it move right;
      its workloads are priced again at the new size) unless it would run past the empty ranks or the world;
      when no block can double, the micro-batch becomes instead every document, longest first, that fits
      within ``m`` tokens per rank over the whole world as one block, and the others wait.

3. Each field of each document (tokens, labels, loss_mask, position_ids: one element per token; the original
   and padded length: one element) goes from the DP rank that loaded it to every rank of its block.

A block of ``c`` ranks trains its documents with CP ``c``: every one of its ranks holds all of them (each
document zigzagged over the block). :func:`check` lists what breaks the invariants a run needs: every document
trained exactly once, every block an aligned power-of-two run of ranks (Megatron only has process groups for
those), no rank idle in a micro-batch (every rank runs the same number of micro-batches).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, log2

import numpy as np

__all__ = [
    "CAP_DELTA",
    "FIELD_BYTES",
    "SCALAR_BYTES",
    "Block",
    "Schedule",
    "Traffic",
    "check",
    "dcp_gpus_needed",
    "dp_balanced",
    "next_micro_batch",
    "schedule",
    "traffic",
]

CAP_DELTA = 0.05  # the workload cap's slack over l_tall · m
# bytes per element of the fields rerouted for every document: one element per token (int64 ids, labels and
# positions, float32 loss mask) ...
FIELD_BYTES = {"tokens": 8, "labels": 8, "loss_mask": 4, "position_ids": 8}
SCALAR_BYTES = {"original_seq_len": 8, "padded_seq_len": 8}  # ... and one int64 element per document each


def dcp_gpus_needed(length: int, max_per_rank: int, min_cp: int = 1) -> int:
    """The smallest CP size the scheduler gives a document of ``length`` tokens: a power of two ``c`` with
    ``length / c ≤ max_per_rank``, at least ``min_cp``."""
    raw = max(1, 2 ** ceil(log2(length / max_per_rank))) if length > 0 else 1
    return max(min_cp, raw)


def next_micro_batch(
    docs: list[tuple[int, int]], world: int, max_per_rank: int, min_cp: int = 1
) -> tuple[list[list[int]], list[tuple[int, int]]]:
    """One micro-batch formed from ``docs`` ((id, length), any order): per rank the ids it trains (a block's
    ranks each list all of the block's documents), and the documents left for later micro-batches (longest
    first). Step 2 of the module's description."""
    if not docs:
        return [[] for _ in range(world)], []
    docs = sorted(docs, key=lambda d: -d[1])  # stable: equal lengths keep their order
    tall = docs[0][1]
    cap = float(tall) * float(max_per_rank) * (1.0 + CAP_DELTA)
    ids: list[list[int]] = [[] for _ in range(world)]
    lens: list[list[int]] = [[] for _ in range(world)]
    work = [0.0] * world  # per rank: Σ l² / c of what it holds
    members: list[list[int]] = []  # per block: its ranks
    size: list[int] = []  # per block: its CP size
    packed: list[float] = []  # per block: tokens per rank, Σ l / c
    free = world  # ranks free[...] are the lowest ranks no block holds: taken in order, so a suffix
    first_free = 0

    def place(block: int, doc: int, length: int) -> None:
        c = size[block]
        packed[block] += length / c
        for r in members[block]:
            ids[r].append(doc)
            lens[r].append(length)
            work[r] += length * length / c

    def open_block(ranks: list[int], doc: int, length: int) -> None:
        nonlocal free, first_free
        members.append(ranks)
        size.append(len(ranks))
        packed.append(0.0)
        free -= len(ranks)
        first_free += len(ranks)
        place(len(members) - 1, doc, length)

    doc0, len0 = docs[0]
    c0 = dcp_gpus_needed(len0, max_per_rank, min_cp)
    if c0 > world:
        raise ValueError(f"a document of {len0} tokens needs CP {c0}, more than the {world} DP×CP ranks")
    open_block(list(range(c0)), doc0, len0)
    left: list[tuple[int, int]] = []
    for doc, length in docs[1:]:
        # each block's ranks carry one workload (they get the same documents), a free rank 0: the largest
        # workload outside a block is the largest of the other blocks'
        block_work = [work[m[0]] for m in members]
        top = max(range(len(members)), key=lambda b: (block_work[b], -b))
        second = max((block_work[b] for b in range(len(members)) if b != top), default=0.0)
        overall = block_work[top]
        best: tuple[float, int, int, bool] | None = None  # (largest workload after, c, block, opens)
        c = dcp_gpus_needed(length, max_per_rank, min_cp)
        while c <= world:
            cost = length * length / c
            for b in range(len(members)):  # join an open block of c ranks
                if size[b] != c or packed[b] + length / c > max_per_rank:
                    continue
                after = max(second if b == top else overall, block_work[b] + cost)
                if after <= cap and (best is None or after < best[0]):
                    best = (after, c, b, False)
            if free >= c:  # open one on the c lowest free ranks (workload 0)
                after = max(overall, cost)
                if after <= cap and (best is None or after < best[0]):
                    best = (after, c, -1, True)
            c *= 2
        if best is None:
            left.append((doc, length))
        elif best[3]:
            open_block(list(range(first_free, first_free + best[1])), doc, length)
        else:
            place(best[2], doc, length)

    def widen_smallest() -> bool:
        """Step 2c once: double the first block of the smallest size that can; False when none can."""
        nonlocal ids, lens, work
        empty = next(r for r in range(world) if not ids[r])
        if any(ids[r] for r in range(empty, world)):
            raise AssertionError("empty ranks are expected only at the end of the world")
        smallest = min(size)
        wider = min(2 * smallest, world)
        grow = wider - smallest
        for b in range(len(members)):
            if size[b] != smallest:
                continue
            lo, hi = members[b][0], members[b][-1]
            if hi + 1 > empty or hi + grow >= world:
                continue
            new_ids: list[list[int]] = [[] for _ in range(world)]
            new_lens: list[list[int]] = [[] for _ in range(world)]
            new_work = [0.0] * world
            for r in range(lo):
                new_ids[r], new_lens[r], new_work[r] = ids[r], lens[r], work[r]
            for r in range(lo, hi + grow + 1):  # the block's documents, priced at the new size
                new_ids[r], new_lens[r] = list(ids[hi]), list(lens[hi])
                new_work[r] = sum(x * x / wider for x in lens[hi])
            for k, r in enumerate(range(hi + 1, empty)):  # the ranks after it, moved right
                new_ids[hi + grow + 1 + k], new_lens[hi + grow + 1 + k] = ids[r], lens[r]
                new_work[hi + grow + 1 + k] = work[r]
            size[b] = wider
            members[b] = list(range(lo, hi + grow + 1))
            for o in range(len(members)):
                if o != b and min(members[o]) > hi:
                    members[o] = [r + grow for r in members[o]]
            ids, lens, work = new_ids, new_lens, new_work
            return True
        return False

    while any(not x for x in ids):
        if not widen_smallest():  # the whole world as one block, of the documents that fit it
            chosen: list[int] = []
            left = []
            per_rank = 0.0
            for doc, length in docs:
                if per_rank + length / world <= max_per_rank:
                    chosen.append(doc)
                    per_rank += length / world
                else:
                    left.append((doc, length))
            if not chosen:
                raise ValueError("no document fits the whole DP×CP world: raise max_seqlen_per_dp_cp_rank")
            ids = [list(chosen) for _ in range(world)]
            break
    return ids, left


@dataclass(frozen=True)
class Block:
    """One CP block of a micro-batch: ranks ``first`` … ``first + size − 1`` train ``docs`` (ids) together."""

    first: int
    size: int
    docs: tuple[int, ...]


@dataclass(frozen=True)
class Schedule:
    """A global batch as the scheduler lays it out: per micro-batch, per rank, the document ids it trains."""

    micro_batches: list[list[list[int]]]
    world: int

    def blocks(self, k: int) -> list[Block]:
        """Micro-batch ``k``'s CP blocks, in rank order: the ranks whose lists hold the first document of a
        rank's list, as Megatron derives ``local_cp_size`` (runs of ranks with one list)."""
        out: list[Block] = []
        mb = self.micro_batches[k]
        r = 0
        while r < self.world:
            first_doc = mb[r][0] if mb[r] else None
            s = 1
            while r + s < self.world and first_doc is not None and first_doc in mb[r + s]:
                s += 1
            out.append(Block(r, s, tuple(mb[r])))
            r += s
        return out

    def degree(self, n_docs: int) -> np.ndarray:
        """int64 [n_docs]: the CP size each document is trained with (0 where it is nowhere)."""
        out = np.zeros(n_docs, dtype=np.int64)
        for k in range(len(self.micro_batches)):
            for b in self.blocks(k):
                out[list(b.docs)] = b.size
        return out


def schedule(lengths: np.ndarray, dp: int, cp: int, max_per_rank: int, min_cp: int = 1) -> Schedule:
    """``DefaultDynamicCPScheduler`` over one global batch of documents of ``lengths`` tokens (document ``i``
    has id ``i``) on ``dp × cp`` ranks with ``max_seqlen_per_dp_cp_rank = max_per_rank`` (no virtual pipeline:
    no alignment of the micro-batch count)."""
    world = dp * cp
    left = sorted(((i, int(x)) for i, x in enumerate(np.asarray(lengths).tolist())), key=lambda d: -d[1])
    out = []
    while left:
        mb, left = next_micro_batch(left, world, max_per_rank, min_cp)
        out.append(mb)
    return Schedule(out, world)


def dp_balanced(lengths: np.ndarray, dp: int, cp: int, max_per_rank: int) -> Schedule:
    """``DpBalancedScheduler``, the static-CP packing of the same file (the baseline ``--validate`` compares
    with): documents in their order into sequences of at most ``max_per_rank · cp`` tokens; the number of
    sequences raised to a multiple of ``dp`` by moving documents, one at a time, off the last sequences that
    hold more than one into sequences of their own; micro-batch ``i`` gives DP rank ``j`` (its ``cp`` ranks, one
    block) sequence ``i · dp + j``."""
    limit = max_per_rank * cp
    packs: list[list[int]] = []
    current: list[int] = []
    total = 0
    for i, x in enumerate(np.asarray(lengths).tolist()):
        if current and total + x > limit:
            packs.append(current)
            current, total = [], 0
        current.append(i)
        total += x
    if current:
        packs.append(current)
    need = -len(packs) % dp
    k = len(packs) - 1
    while need > 0:
        if k < 0:
            raise ValueError("not enough documents to give every DP rank a sequence")
        if len(packs[k]) > 1:
            packs.append([packs[k].pop()])
            need -= 1
        else:
            k -= 1
    micro = [[list(packs[i * dp + r // cp]) for r in range(dp * cp)] for i in range(len(packs) // dp)]
    return Schedule(micro, dp * cp)


def check(s: Schedule, n_docs: int) -> list[str]:
    """What breaks a run's invariants (empty: none): every document in exactly one block of one micro-batch,
    every block a power-of-two run of ranks aligned to its size whose ranks hold one list, no idle rank."""
    problems: list[str] = []
    seen = np.zeros(n_docs, dtype=np.int64)
    for k, mb in enumerate(s.micro_batches):
        if len(mb) != s.world:
            problems.append(f"micro-batch {k} has {len(mb)} rank lists for {s.world} ranks")
            continue
        for r, docs in enumerate(mb):
            if not docs:
                problems.append(f"micro-batch {k}: rank {r} is idle")
        for b in s.blocks(k):
            if not b.docs:
                continue
            if b.size & (b.size - 1) or b.first % b.size:
                problems.append(f"micro-batch {k}: block of ranks {b.first}…{b.first + b.size - 1} is not aligned")
            if any(mb[r] != list(b.docs) for r in range(b.first, b.first + b.size)):
                problems.append(f"micro-batch {k}: ranks of the block at {b.first} hold different documents")
            seen[list(b.docs)] += 1
    if (seen != 1).any():
        bad = np.flatnonzero(seen != 1)
        problems.append(f"{len(bad)} documents trained other than once (first: {int(bad[0])}, {seen[bad[0]]}×)")
    return problems


@dataclass(frozen=True)
class Traffic:
    """What one global batch's rescheduling costs: collective calls each rank makes, and bytes sent to another
    rank, summed over all ranks (what a rank sends to itself is free), with the per-field all-to-all and with
    the per-field all-gather that replaced it."""

    collectives: int
    bytes_alltoall: int
    bytes_allgather: int


def traffic(lengths: np.ndarray, owner: np.ndarray, s: Schedule, dp: int, cp: int) -> Traffic:
    """The rescheduling's traffic for documents of ``lengths`` tokens that DP rank ``owner[i]`` loaded (every
    rank of its CP lane holds a copy), laid out as ``s``; rank ``d · cp + c`` is DP rank ``d``, CP lane ``c``."""
    lengths = np.asarray(lengths, dtype=np.int64)
    owner = np.asarray(owner, dtype=np.int64)
    per_token = sum(FIELD_BYTES.values())
    per_doc = sum(SCALAR_BYTES.values())
    counts = np.bincount(owner, minlength=dp)
    tokens = np.bincount(owner, weights=lengths, minlength=dp)
    # step 1, in each of the cp DP groups: an int32 count, then the int32 lengths padded to the largest count
    gather = cp * dp * (dp - 1) * (4 + 4 * int(counts.max()))
    moved = 0
    for r in range(dp * cp):
        mine = {i for mb in s.micro_batches for i in mb[r]}  # every document rank r trains, once
        if not mine:
            continue
        away = np.fromiter(mine, dtype=np.int64)
        away = away[owner[away] != r // cp]  # sent by the same lane's rank of the loading DP rank
        moved += int(lengths[away].sum()) * per_token + len(away) * per_doc
    # d48bd6be: per field, every rank of a DP group gathers every rank's share, padded to the largest
    allgather = dp * cp * (dp - 1) * (int(tokens.max()) * per_token + int(counts.max()) * per_doc)
    fields = len(FIELD_BYTES) + len(SCALAR_BYTES)
    return Traffic(2 + fields, gather + moved, gather + allgather)
