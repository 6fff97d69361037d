"""The draw: each source's units (whole documents, or S-token pieces of longer ones) in a seeded order,
assigned to steps against the source's cumulative quota, streamed in bounded memory.

The order is a fresh order of the source's documents per epoch (:mod:`mixing.plan.order`: sorted by DuckDB
on seeded 64-bit keys, read a chunk at a time), cut into pieces, the pieces of a long document spread over
its block of :data:`SPREAD_DOCS` documents (:func:`_order`); a unit's ``ord`` is its place in that order
counted across epochs. Each length segment (consecutive phases
with the same ``max_doc_tokens``) walks the order from the start: the units whose document fits its limit
and that no earlier segment took, in order, go to the first step whose cumulative quota (from the
segment's start) exceeds the unit's midpoint in the cumulative draw, so through any step the tokens drawn
stay within half a unit of the quota. A segment takes a prefix of what it may draw, so what earlier
segments took is named by (limit, first ord not taken) pairs, not by a set of units.

Memory: one chunk of :data:`CHUNK_DOCS` documents, one block of :data:`SPREAD_DOCS` documents and its
units, whatever the number of documents (the order's sort is DuckDB's, within its ``memory_limit``). The
units come out per source, segment by segment, in (step, ord) order (with deferred units, in step
order: a deferred unit may follow a unit of a later ord on its step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from mixing.plan.order import DrawOrder

__all__ = ["CHUNK_DOCS", "SPREAD_DOCS", "SegmentQuota", "Trained", "draw_source"]

CHUNK_DOCS = 1 << 19  # documents of the order read at a time
SPREAD_DOCS = 1 << 16  # documents of the order a long document's pieces are spread over (bounds the memory)


@dataclass(frozen=True)
class SegmentQuota:
    """One length segment as a source sees it: ``limit`` (its ``max_doc_tokens``, or None); ``steps``
    int64 [k], the segment's steps with a positive quota of the source, ascending; ``cum2`` int64 [k],
    twice the source's cumulative quota from the segment's start through each of them (strictly rising)."""

    limit: int | None
    steps: np.ndarray
    cum2: np.ndarray


Units = dict[str, np.ndarray]  # step, doc_id, piece, start, length, epoch, ord: int64 columns of equal length


def _blocks(order: DrawOrder, epoch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The epoch's order as (doc_id, n_tokens) blocks of :data:`SPREAD_DOCS` documents (the last may be shorter),
    whatever :data:`CHUNK_DOCS` the order is read by."""
    held_ids: list[np.ndarray] = []
    held_lens: list[np.ndarray] = []
    n = 0
    for ids, lens in order(epoch, CHUNK_DOCS):
        held_ids.append(ids)
        held_lens.append(lens)
        n += len(ids)
        while n >= SPREAD_DOCS:
            all_ids, all_lens = np.concatenate(held_ids), np.concatenate(held_lens)
            yield all_ids[:SPREAD_DOCS], all_lens[:SPREAD_DOCS]
            held_ids, held_lens, n = [all_ids[SPREAD_DOCS:]], [all_lens[SPREAD_DOCS:]], n - SPREAD_DOCS
    if n:
        yield np.concatenate(held_ids), np.concatenate(held_lens)


def _order(order: DrawOrder, seq: int, epochs: int, spread: bool = True) -> Iterator[Units]:
    """The source's units in draw order, a block of documents at a time: doc_id, piece, start, length, doc_len,
    epoch, ord.

    With ``spread`` (the plan's way) the pieces of a long document are spread evenly over its block of
    :data:`SPREAD_DOCS` documents of the order (piece ``p`` of the document at place ``r`` of ``n`` goes to place
    ``⌊r + p·n/pieces⌋ mod n``; ties by place, document, piece), so that they reach the trainer far apart, not in
    consecutive steps (one book back to back over a short run); without it they follow one another (the order
    before spreading, kept for ``benchmarks/packing.py``'s comparison). Blocks are cut by documents, not by
    :data:`CHUNK_DOCS`, so the order does not depend on how the order is read.
    """
    base = 0
    for e in range(epochs):
        for ids, lens in _blocks(order, e):
            n_p = np.maximum(1, -(-lens // seq))  # per block: no array of pieces to hold
            rep = np.repeat(np.arange(len(ids)), n_p)
            first = np.repeat(np.cumsum(n_p) - n_p, n_p)
            piece = np.arange(len(rep), dtype=np.int64) - first
            if spread and len(rep) > len(ids):  # some document has several pieces: spread them
                n = len(ids)
                place = (rep * n_p[rep] + piece * n) // n_p[rep] % n  # ⌊r + p·n/pieces⌋ mod n, exact in int64
                at = np.lexsort((piece, rep, place))
                rep, piece = rep[at], piece[at]
            start = piece * seq
            doc_len = lens[rep]
            yield {
                "doc_id": ids[rep],
                "piece": piece,
                "start": start,
                "length": np.minimum(seq, doc_len - start),
                "doc_len": doc_len,
                "epoch": np.full(len(rep), e, np.int64),
                "ord": np.arange(base, base + len(rep), dtype=np.int64),
            }
            base += len(rep)


def _defer(u: Units, later: np.ndarray, held: list[Units]) -> Units:
    """``u`` without its deferred units (ords in ``later``), which join ``held`` (kept in draw order)."""
    out = np.isin(u["ord"], later)
    if not out.any():
        return u
    held.append({k: v[out] for k, v in u.items()})
    return {k: v[~out] for k, v in u.items()}


def _reinsert(
    u: Units, held: list[Units], seg: SegmentQuota, before: int, later: np.ndarray, after: np.ndarray
) -> bool:
    """Put back into ``u`` (the chunk's units, ``before`` tokens drawn ahead of it) the held units whose step
    the segment passes within it: each just before the first unit that starts at or past the tokens drawn by
    that step, so that its midpoint, hence its step, is past it. A held unit whose step is the segment's last
    (or later) stays held: the segment leaves it. Returns whether any went back (``held``'s last is then the
    chunk with them, to be placed anew)."""
    pool = {k: np.concatenate([h[k] for h in held]) for k in held[0]}
    must = after[np.searchsorted(later, pool["ord"])]  # the step each must pass
    k = np.searchsorted(seg.steps, must, side="right") - 1  # the segment's last step at or before it (-1: none)
    bound2 = np.where(k >= 0, seg.cum2[np.maximum(k, 0)], 0)  # twice the tokens drawn through that step
    length = u["length"]
    start2 = 2 * (before + np.cumsum(length) - length)  # twice each unit's start in the draw
    where = np.searchsorted(start2, bound2, side="left")
    back = (k < len(seg.steps) - 1) & (where < len(start2))
    if not back.any():
        return False
    held.clear()
    if (~back).any():
        held.append({k_: v[~back] for k_, v in pool.items()})
    held.append({key: np.insert(u[key], where[back], pool[key][back]) for key in u})
    return True


Trained = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``trained(doc_id, start)``: int64 [n], in how many epochs each piece was already trained (a continuation's
base, :class:`mixing.continuation.Used`); the draw skips a piece in those first epochs."""


def draw_source(
    order: DrawOrder,
    n_docs: int,
    *,
    seq: int,
    epochs: int,
    segments: list[SegmentQuota],
    trained: Trained | None = None,
    spread: bool = True,
    deferred: Mapping[int, int] | None = None,
) -> Iterator[Units]:
    """The units of a source each segment takes, with their ``step``, at most ``epochs`` epochs.

    ``order``: the source's documents (doc_id, n_tokens) in each epoch's draw order; ``n_docs`` of them.
    ``trained``: pieces a continuation's base trained already, skipped in the epochs it trained them in (so
    the draw takes, in order, every piece the base had not: those it drew but carried past the switch first).
    ``spread``: the pieces of a long document spread over the order (see :func:`_order`).
    ``deferred``: ord → step: units that must not be drawn by that step or before (the whole documents a phase's
    packing dropped; the caller draws that phase short by their tokens): each moves in the order to just past the
    units drawn by that step, so it opens the next phase that draws the source in the segment, or, with none,
    the next segment whose limit it fits (with none either, it is not drawn).
    A segment that runs out
    of units before its last step simply takes fewer tokens (the caller compares them to its demand).
    Deterministic; the result does not depend on :data:`CHUNK_DOCS`.
    """
    later = np.array(sorted(deferred or {}), np.int64)  # the deferred ords, and the step each must pass
    after = np.array([(deferred or {})[o] for o in later.tolist()], np.int64)
    # per earlier segment: (limit, first ord past what it took, the deferred ords it left to later segments)
    taken: list[tuple[int, int, np.ndarray]] = []
    carry: Units | None = None  # deferred units an earlier segment passed on: they open the next that fits them
    for seg in segments:
        if not len(seg.steps) or not epochs or not n_docs:
            continue
        limit = seg.limit if seg.limit is not None else 1 << 62
        before, end = 0, 0  # tokens this segment drew before the chunk; first ord past its last unit
        held: list[Units] = []  # deferred units not yet back in the order
        carried = np.zeros(0, np.int64) if carry is None else carry["ord"]
        if carry is not None and (carry["doc_len"] <= limit).any():
            held.append({k: v[carry["doc_len"] <= limit] for k, v in carry.items()})
        carry = None if carry is None else {k: v[carry["doc_len"] > limit] for k, v in carry.items()}
        drawn: list[np.ndarray] = []  # the deferred ords this segment drew
        for u in _order(order, seq, epochs, spread):  # from the start: earlier segments skip units
            ok = u["doc_len"] <= limit
            if len(carried):  # the carried come in at the start
                ok &= ~np.isin(u["ord"], carried)
            if trained is not None:
                ok &= u["epoch"] >= trained(u["doc_id"], u["start"])
            for lim, past, left in taken:
                earlier = (u["ord"] < past) & (u["doc_len"] <= lim)
                ok &= ~(earlier & ~np.isin(u["ord"], left)) if len(left) else ~earlier
            if not ok.all():
                u = {k: v[ok] for k, v in u.items()}
            if len(later):
                u = _defer(u, later, held)
            at = np.zeros(0, np.int64)
            while True:  # the deferred units go back in just past the units drawn by their step
                length = u["length"]
                mid2 = 2 * (before + np.cumsum(length)) - length  # twice each unit's midpoint in the draw
                at = np.searchsorted(seg.cum2, mid2, side="right")
                if not held or not _reinsert(u, held, seg, before, later, after):
                    break
                u = held.pop()
            n = int(np.searchsorted(at, len(seg.cum2)))  # mid2 rises: the units that fit are a prefix
            if n:
                out = {k: v[:n] for k, v in u.items() if k != "doc_len"}
                out["step"] = seg.steps[at[:n]]
                end = max(end, int(out["ord"].max()) + 1)
                if len(later):  # the membership test only when something is deferred (every plan's hot loop)
                    drawn.append(out["ord"][np.isin(out["ord"], later)])
                yield out
            if n < len(u["length"]):
                break
            before += int(u["length"].sum())
        taken.append((limit, end, np.setdiff1d(later, np.concatenate(drawn)) if drawn else later))
        # what this segment was to take past one of its steps and could not: passed on, in draw order
        # (the deferred units of later segments' steps it met in its walk are met again in theirs)
        last = seg.steps[-1]
        kept = [h for h in held if len(h["ord"])] + ([carry] if carry is not None and len(carry["ord"]) else [])
        if kept:
            pool = {k: np.concatenate([h[k] for h in kept]) for k in kept[0]}
            mine = after[np.searchsorted(later, pool["ord"])] <= last
            by = np.argsort(pool["ord"][mine], kind="stable")
            carry = {k: v[mine][by] for k, v in pool.items()} if mine.any() else None
        else:
            carry = None
