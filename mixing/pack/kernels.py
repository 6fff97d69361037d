"""The compiled packing engine's kernels: plain Python that numba compiles (``njit``, cached, without the GIL).

They work on :class:`mixing.pack.pool.CompiledPool`'s arrays, whose meaning its comments give: ``slots``
(the pool's units, int64 [capacity, 6] = (length, source, doc_id, start, step, ord)) indexed by slot; per
(source, length) a FIFO of slots in plan order (``head``, ``tail``, ``nxt``); per source a 1-based Fenwick
tree of counts over lengths 0..S (``fen``, positions 1..n with n = S + 1); the urgent units (the first of their
FIFOs) counted per (source, length) and per block of 64 lengths (``ucnt``, ``ublk``); ``cnt``, ``top_len`` and
``bot_len`` per source and then per source's urgent units; a ring of the units not yet aged (``log``,
``log_step``); and ``meta`` = (free slots, urgent units, next serial, the step aged to, first serial not yet
aged). :data:`COMPILED` holds the kernels compiled; called as plain functions they run in the interpreter
(the ``"interpreted"`` engine, for the tests) and make the same decisions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from contract.cost import cost_formula

njit: Any
try:  # a dependency, but packing still works without it: the pure-Python engine packs the same sequences
    from numba import njit
except ImportError:  # pragma: no cover - depends on the environment
    njit = None

__all__ = [
    "COMPILED", "add_units", "age_units", "fen_add", "fill_bins", "longest_below", "remove_units", "urgent_above",
    "urgent_add", "urgent_below",
]  # fmt: skip


def fen_add(fen: Any, base: int, n: int, i: int, delta: int) -> None:
    while i <= n:
        fen[base + i] += delta
        i += i & (-i)


def longest_below(fen: Any, base: int, n: int, top: int, bound: int) -> int:
    """The longest length < ``bound`` (≤ n) with a unit in the tree at ``base``; -1 if none."""
    c = 0
    i = bound  # positions 1..bound hold lengths 0..bound-1
    while i > 0:
        c += fen[base + i]
        i -= i & (-i)
    if c == 0:
        return -1
    pos, step = 0, top  # the smallest position whose prefix count reaches c: the c-th unit's length
    while step > 0:
        j = pos + step
        if j <= n and fen[base + j] < c:
            pos = j
            c -= fen[base + j]
        step >>= 1
    return pos  # position pos+1 ↔ length pos


def urgent_add(ucnt: Any, ublk: Any, s: int, n: int, length: int, delta: int) -> None:
    ucnt[s * n + length] += delta
    ublk[s * (n // 64 + 1) + (length >> 6)] += delta


def urgent_below(ucnt: Any, ublk: Any, s: int, n: int, bound: int) -> int:
    """The longest length < ``bound`` (≤ n) of an urgent unit of source ``s``; -1 if none."""
    base, bb = s * n, s * (n // 64 + 1)
    at = bound - 1
    b = at >> 6
    if at >= 0 and ublk[bb + b] > 0:  # the rest of its block
        while at >= b << 6:
            if ucnt[base + at] > 0:
                return at
            at -= 1
    b -= 1
    while b >= 0 and ublk[bb + b] == 0:
        b -= 1
    if b < 0:
        return -1
    at = (b << 6) + 63
    while ucnt[base + at] == 0:
        at -= 1
    return at


def urgent_above(ucnt: Any, ublk: Any, s: int, n: int, bound: int) -> int:
    """The shortest length > ``bound`` of an urgent unit of source ``s``; n if none."""
    base, bb, nb = s * n, s * (n // 64 + 1), n // 64 + 1
    at = bound + 1
    if at >= n:
        return n
    b = at >> 6
    if ublk[bb + b] > 0:
        while at < min(n, (b + 1) << 6):
            if ucnt[base + at] > 0:
                return at
            at += 1
    b += 1
    while b < nb and ublk[bb + b] == 0:
        b += 1
    if b >= nb:
        return n
    at = b << 6
    while ucnt[base + at] == 0:
        at += 1
    return at


def add_units(
    units: Any, head: Any, tail: Any, fen: Any, ucnt: Any, ublk: Any, cnt: Any, top_len: Any, bot_len: Any,
    slots: Any, nxt: Any, serial: Any, live: Any, free: Any, log: Any, log_step: Any, meta: Any, n: int, top: int,
) -> None:  # fmt: skip
    """Add ``units`` to their sources' FIFOs in order, and to the log of units not yet aged."""
    nf = meta[0]
    for r in range(units.shape[0]):
        nf -= 1
        slot = free[nf]
        for c in range(6):
            slots[slot, c] = units[r, c]
        length, s = units[r, 0], units[r, 1]
        nxt[slot] = -1
        live[slot] = True
        serial[slot] = meta[2]
        if log.shape[0] > 0:  # with ageing: the ring, whose size is a power of two
            at = meta[2] & (log.shape[0] - 1)
            log[at], log_step[at] = slot, units[r, 4]
        meta[2] += 1
        key = s * n + length
        if tail[key] < 0:
            head[key] = slot
        else:
            nxt[tail[key]] = slot
        tail[key] = slot
        fen_add(fen, s * (n + 1), n, length + 1, 1)
        cnt[s] += 1
        if length > top_len[s]:
            top_len[s] = length
    meta[0] = nf


def age_units(
    k: int, ucnt: Any, ublk: Any, cnt: Any, top_len: Any, bot_len: Any, slots: Any, serial: Any, live: Any,
    log: Any, log_step: Any, meta: Any, n: int,
) -> None:  # fmt: skip
    """Count the units planned at or before step ``meta[3]`` as urgent, in the order they were added, skipping
    those placed since (their slot free, or holding a later unit). They stay in their FIFOs, at the front:
    every unit before them there was planned no later, so it is urgent too, or placed."""
    if log.shape[0] == 0:  # a pool without ageing
        return
    lo, hi, mask, aged = meta[4], meta[2], log.shape[0] - 1, meta[3]  # the ring's size is a power of two
    while lo < hi and log_step[lo & mask] <= aged:
        slot = log[lo & mask]
        if live[slot] and serial[slot] == lo:
            length, s = slots[slot, 0], slots[slot, 1]
            urgent_add(ucnt, ublk, s, n, length, 1)
            v = k + s
            cnt[v] += 1
            if length > top_len[v]:
                top_len[v] = length
            if length < bot_len[v]:
                bot_len[v] = length
            meta[1] += 1
        lo += 1
    meta[4] = lo


def remove_units(
    gone: Any, k: int, head: Any, tail: Any, fen: Any, ucnt: Any, ublk: Any, cnt: Any, top_len: Any,
    bot_len: Any, slots: Any, nxt: Any, serial: Any, live: Any, free: Any, log: Any, log_step: Any, meta: Any,
    n: int, top: int,
) -> None:  # fmt: skip
    """Take the units of slots ``gone`` out of the pool (unlinked from their FIFOs, uncounted)."""
    for r in range(gone.shape[0]):
        slot = gone[r]
        length, s = slots[slot, 0], slots[slot, 1]
        key = s * n + length
        prev, at = -1, head[key]
        while at != slot:  # its FIFO's units before it (a removal is rare: a phase end's few units)
            prev, at = at, nxt[at]
        if prev < 0:
            head[key] = nxt[slot]
        else:
            nxt[prev] = nxt[slot]
        if tail[key] == slot:
            tail[key] = prev
        fen_add(fen, s * (n + 1), n, length + 1, -1)
        cnt[s] -= 1
        if length == top_len[s] and head[key] < 0:
            top_len[s] = longest_below(fen, s * (n + 1), n, top, n)
        if serial[slot] < meta[4] and slots[slot, 4] <= meta[3]:  # counted as urgent
            v = k + s
            urgent_add(ucnt, ublk, s, n, length, -1)
            cnt[v] -= 1
            meta[1] -= 1
            if ucnt[key] == 0:
                if length == top_len[v]:
                    top_len[v] = urgent_below(ucnt, ublk, s, n, length)
                if length == bot_len[v]:
                    bot_len[v] = urgent_above(ucnt, ublk, s, n, length)
        live[slot] = False
        nxt[slot] = -1
        free[meta[0]] = slot
        meta[0] += 1


def fill_bins(
    due: Any, seq_len: int, att: float, lin: float, segs: Any, counts: Any, placed: Any, order: Any, link: Any,
    head: Any, tail: Any, fen: Any, ucnt: Any, ublk: Any, cnt: Any, top_len: Any, bot_len: Any, slots: Any,
    nxt: Any, serial: Any, live: Any, free: Any, log: Any, log_step: Any, meta: Any, n: int, top: int,
) -> int:  # fmt: skip
    """``mixing.pack.python_pool.UnitPool.fill``, ``closer`` and ``longest`` on arrays, decision for decision
    (the units aged since the last fill counted as urgent first). Each choice: the urgent units, then the
    others, among the sources behind that a unit brings closer; where none does, the urgent units, then the
    others, whatever the dues. A unit of a source and length is its FIFO's first: an urgent one when chosen
    as such, and when chosen as another there is no urgent one of that source and length left."""
    k = due.shape[0]
    age_units(k, ucnt, ublk, cnt, top_len, bot_len, slots, serial, live, log, log_step, meta, n)
    n_bins = counts.shape[0]
    b_free = np.full(n_bins, seq_len, np.int64)  # bins sorted by (free, cost, bin)
    b_cost = np.zeros(n_bins, np.float64)
    b_id = np.arange(n_bins)
    b_first = np.full(n_bins, -1, np.int64)  # each bin's placements, chained in order through ``link``
    b_last = np.full(n_bins, -1, np.int64)
    m = 0
    while n_bins > 0 and b_free[n_bins - 1] > 0:
        fit = b_free[n_bins - 1] + 1
        best, best_len, best_due = -1, 0, 0.0
        tier = 0
        if meta[1] > 0:  # 1. urgent units of the sources behind that bring them closer: the longest
            for s in range(k):
                v, d = k + s, due[s]
                if d <= 0 or top_len[v] < best_len or bot_len[v] >= fit:  # none, none to beat the best, none fits
                    continue
                two = 2 * d
                bound = fit if fit < two else math.ceil(two)  # an integer l < 2d ⇔ l < ceil(2d)
                if bot_len[v] >= bound:
                    continue
                ln = top_len[v] if top_len[v] < bound else urgent_below(ucnt, ublk, s, n, bound)
                if ln >= 0 and (ln > best_len or (ln == best_len and d > best_due)):
                    best, best_len, best_due = s, ln, d
            if best >= 0:
                tier = k
        if best < 0:  # 2. the others, likewise (a source's urgent units of such lengths are all placed by now)
            for s in range(k):
                d = due[s]
                if d <= 0 or top_len[s] < best_len:  # empty, or cannot beat the best so far
                    continue
                two = 2 * d
                bound = fit if fit < two else math.ceil(two)
                ln = top_len[s] if top_len[s] < bound else longest_below(fen, s * (n + 1), n, top, bound)
                if ln >= 0 and (ln > best_len or (ln == best_len and d > best_due)):
                    best, best_len, best_due = s, ln, d
        if best < 0 and meta[1] > 0:  # 3. none: the longest urgent unit that fits, whatever the dues
            for s in range(k):
                v = k + s
                if top_len[v] < best_len or bot_len[v] >= fit:
                    continue
                ln = top_len[v] if top_len[v] < fit else urgent_below(ucnt, ublk, s, n, fit)
                if ln >= 0 and (ln > best_len or (ln == best_len and due[s] > best_due)):
                    best, best_len, best_due = s, ln, due[s]
            if best >= 0:
                tier = k
        if best < 0:  # 4. none either: the longest that fits from any source, so that padding does not grow
            for s in range(k):
                if top_len[s] < best_len:
                    continue
                ln = top_len[s] if top_len[s] < fit else longest_below(fen, s * (n + 1), n, top, fit)
                if ln >= 0 and (ln > best_len or (ln == best_len and due[s] > best_due)):
                    best, best_len, best_due = s, ln, due[s]
        if best < 0:
            break
        key = best * n + best_len  # take the earliest planned unit of that source and length: an urgent
        slot = head[key]  # one if it was chosen as such (they lead their FIFO), else none of that length is
        head[key] = nxt[slot]
        if nxt[slot] < 0:
            tail[key] = -1
        fen_add(fen, best * (n + 1), n, best_len + 1, -1)
        cnt[best] -= 1
        if best_len == top_len[best] and head[key] < 0:  # its longest are gone: find the next longest
            top_len[best] = longest_below(fen, best * (n + 1), n, top, n)
        if tier > 0:
            v = k + best
            urgent_add(ucnt, ublk, best, n, best_len, -1)
            cnt[v] -= 1
            meta[1] -= 1
            if ucnt[best * n + best_len] == 0:  # no urgent unit of that length is left
                if best_len == top_len[v]:
                    top_len[v] = urgent_below(ucnt, ublk, best, n, best_len)
                if best_len == bot_len[v]:
                    bot_len[v] = urgent_above(ucnt, ublk, best, n, best_len)
        live[slot] = False
        free[meta[0]] = slot  # not reused before the next add: its row stays readable below
        meta[0] += 1
        length = best_len  # best fit: the first bin in (free, cost, bin) order with free ≥ length
        lo, hi = 0, n_bins
        while lo < hi:
            mid = (lo + hi) // 2
            if b_free[mid] < length:
                lo = mid + 1
            else:
                hi = mid
        at = lo
        f = b_free[at] - length
        c = b_cost[at] + cost(att, lin, length * length, length)
        b = b_id[at]
        lo, hi = 0, at  # its new key sorts at or before its old place: find where, shift the rest up
        while lo < hi:
            mid = (lo + hi) // 2
            if b_free[mid] < f or (b_free[mid] == f and (b_cost[mid] < c or (b_cost[mid] == c and b_id[mid] < b))):
                lo = mid + 1
            else:
                hi = mid
        for j in range(at, lo, -1):
            b_free[j], b_cost[j], b_id[j] = b_free[j - 1], b_cost[j - 1], b_id[j - 1]
        b_free[lo], b_cost[lo], b_id[lo] = f, c, b
        order[m], link[m] = slot, -1
        if b_last[b] < 0:
            b_first[b] = m
        else:
            link[b_last[b]] = m
        b_last[b] = m
        m += 1
        placed[best] += length
        due[best] -= length
    pos = 0
    for b in range(n_bins):  # bin by bin, each in placement order
        counts[b] = 0
        j = b_first[b]
        while j >= 0:
            slot = order[j]
            segs[pos, 0], segs[pos, 1], segs[pos, 2], segs[pos, 3] = (
                slots[slot, 1],
                slots[slot, 2],
                slots[slot, 3],
                slots[slot, 0],
            )
            pos += 1
            counts[b] += 1
            j = link[j]
    return m


# the one cost formula (contract.cost), compiled below with the kernels; numba's cache of the kernels does
# not notice a change to that file: clear mixing/pack/__pycache__ after changing the formula
cost = cost_formula

COMPILED: dict[str, Any] = {}  # the kernels compiled, by name: empty without numba
if njit is not None:  # the helpers too, so that the kernels run by the interpreter call them compiled
    cost = njit(cache=True, nogil=True)(cost)
    fen_add = njit(cache=True, nogil=True)(fen_add)
    longest_below = njit(cache=True, nogil=True)(longest_below)
    urgent_add = njit(cache=True, nogil=True)(urgent_add)
    urgent_below = njit(cache=True, nogil=True)(urgent_below)
    urgent_above = njit(cache=True, nogil=True)(urgent_above)
    age_units = njit(cache=True, nogil=True)(age_units)
    for _f in (add_units, remove_units, fill_bins):
        COMPILED[_f.__name__] = njit(cache=True, nogil=True)(_f)
