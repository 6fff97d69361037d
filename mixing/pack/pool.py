"""The packer's inner loop: a phase's pool of unplaced units, and filling one step's bins from it.

Two engines with one interface and the same results, unit for unit (the tests hold them to it):

- ``"compiled"`` (:class:`CompiledPool`, needs numba): the pool as flat arrays — per source and length a
  FIFO of units (in plan order) and a Fenwick tree of counts over lengths, so "the longest unit of source
  s shorter than x" costs O(log S) and taking it O(1); the bins as arrays kept sorted by
  (free, cost, bin). About 0.3 µs per unit in one thread, without the GIL.
- ``"python"`` (:class:`~mixing.pack.python_pool.PythonPool`, :mod:`mixing.pack.python_pool`), about 10 µs
  per unit: the fallback where numba is not installed.

A third engine, ``"interpreted"``, runs the compiled engine's kernels in the Python interpreter (about as
slow as ``"python"``): the tests check the kernels with it where numba is not installed.

The compiled kernels are cached by numba (``__pycache__``, or its user-wide cache where that is read-only):
the first call in a process loads them (about a second), or compiles them once (a few seconds). numba itself
is imported by the first compiled pool, not with this module: ~0.3 s that every process loading the
definitions paid (the UI's code server, each step's process), most of which pack nothing.

Both hold only the units handed to them (a phase's carry plus two steps), never the whole plan.
"""

from __future__ import annotations

import importlib.util
import math
import threading
from typing import Any, Protocol

import numpy as np

from contract.cost import CostModel, cost_formula
from mixing.pack.python_pool import PythonPool

# a dependency, but packing still works without it: the pure-Python engine packs the same sequences, ~15× slower
_HAS_NUMBA = importlib.util.find_spec("numba") is not None

__all__ = ["ENGINES", "CompiledPool", "Pool", "PythonPool", "default_engine", "make_pool"]

ENGINES = ("compiled", "python")


class Pool(Protocol):
    """A phase's unplaced units. Units are int64 rows (length, source index, doc_id, start, step, ord)."""

    def add(self, units: np.ndarray) -> None:
        """Add one step's units, sorted by (source, ord, doc_id, start), steps in increasing order; or, into an
        empty pool, several steps' units sorted by (step, source, ord, doc_id, start)."""

    def __len__(self) -> int:
        """Units in the pool."""
        ...

    def fill(self, want: np.ndarray, segs: np.ndarray, counts: np.ndarray) -> tuple[int, np.ndarray]:
        """Fill ``len(counts)`` fresh bins given each source's due tokens ``want`` (float64 [k]); placed
        units leave the pool. Writes units per bin into ``counts`` and the placed units into ``segs`` (room
        for ``len(self)`` rows) as (source, doc_id, start, length), bin by bin in placement order. Returns
        (units placed, tokens placed per source float64 [k])."""
        ...

    def drain(self) -> np.ndarray:
        """Empty the pool: its units as int64 [n, 4] segments ordered by (source, step, ord, length)."""
        ...

    def take_all(self) -> np.ndarray:
        """Empty the pool: its units as int64 [n, 6] rows (length, source, doc_id, start, step, ord) ordered by
        (step, source, ord, doc_id, start), which :meth:`add` takes back as they were (the phase end's dry
        runs, :mod:`mixing.pack.phase_end`)."""
        ...


def default_engine() -> str:
    """``"compiled"`` where numba is installed, else ``"python"``."""
    return "compiled" if _HAS_NUMBA else "python"


def make_pool(engine: str, n_src: int, seq_len: int, cost: CostModel) -> Pool:
    if engine == "compiled":
        if not _HAS_NUMBA:
            raise ValueError("the compiled packing engine needs numba, which is not installed")
        return CompiledPool(n_src, seq_len, cost)
    if engine == "python":
        return PythonPool(n_src, seq_len, cost)
    if engine == "interpreted":
        return CompiledPool(n_src, seq_len, cost, interpreted=True)
    raise ValueError(f"unknown packing engine {engine!r}; one of {ENGINES} (or 'interpreted', for tests)")


class CompiledPool:
    """The pool as arrays for the numba kernels below (see the module docstring)."""

    def __init__(self, n_src: int, seq_len: int, cost: CostModel, *, interpreted: bool = False) -> None:
        kernels: tuple[Any, Any] = (_add_kernel, _fill_kernel) if interpreted else _compiled()
        self.add_kernel, self.fill_kernel = kernels
        self.k, self.seq_len = n_src, seq_len
        self.att, self.lin = float(cost.attention), float(cost.linear)
        self.n = seq_len + 1  # Fenwick positions 1..S+1 hold lengths 0..S
        self.top = 1 << (self.n.bit_length() - 1)  # the largest power of two ≤ n, for Fenwick searches
        self.head = np.full(n_src * self.n, -1, np.int64)  # per (source, length): first unit's slot
        self.tail = np.full(n_src * self.n, -1, np.int64)
        self.fen = np.zeros(n_src * (self.n + 1), np.int64)
        self.cnt = np.zeros(n_src, np.int64)
        self.top_len = np.full(n_src, -1, np.int64)  # per source: its longest unit's length, -1 if none
        self.units = np.zeros((0, 6), np.int64)  # slot → (length, source, doc_id, start, step, ord)
        self.nxt = np.zeros(0, np.int64)  # slot → next slot of its FIFO, -1 at the end
        self.live = np.zeros(0, np.bool_)
        self.free = np.zeros(0, np.int64)  # stack of free slots, the first meta[0] entries
        self.meta = np.zeros(1, np.int64)
        self.order = np.zeros(0, np.int64)  # scratch for one fill: placements' slots and their bins' chains
        self.link = np.zeros(0, np.int64)

    def _grow(self, need: int) -> None:
        cap = len(self.units)
        new = max(2 * cap, cap + need, 1024)
        self.units = np.concatenate([self.units, np.zeros((new - cap, 6), np.int64)])
        self.nxt = np.concatenate([self.nxt, np.full(new - cap, -1, np.int64)])
        self.live = np.concatenate([self.live, np.zeros(new - cap, np.bool_)])
        nf = int(self.meta[0])
        free = np.empty(new, np.int64)
        free[: new - cap] = np.arange(new - 1, cap - 1, -1)  # new slots at the bottom: reused last
        free[new - cap : new - cap + nf] = self.free[:nf]
        self.free, self.meta[0] = free, nf + new - cap
        self.order, self.link = np.zeros(new, np.int64), np.zeros(new, np.int64)

    def add(self, units: np.ndarray) -> None:
        if not len(units):
            return
        if self.meta[0] < len(units):
            self._grow(len(units) - int(self.meta[0]))
        self.add_kernel(np.ascontiguousarray(units, np.int64), *self._state())

    def __len__(self) -> int:
        return len(self.units) - int(self.meta[0])

    def fill(self, want: np.ndarray, segs: np.ndarray, counts: np.ndarray) -> tuple[int, np.ndarray]:
        placed = np.zeros(self.k, np.float64)
        due = np.array(want, dtype=np.float64)
        m = self.fill_kernel(
            due, self.seq_len, self.att, self.lin, segs, counts, placed, self.order, self.link, *self._state()
        )
        return int(m), placed

    def drain(self) -> np.ndarray:
        slots = np.flatnonzero(self.live)
        u = self.units[slots]
        order = np.lexsort((u[:, 3], u[:, 2], u[:, 0], u[:, 5], u[:, 4], u[:, 1]))  # source, step, ord, len
        out = u[order][:, [1, 2, 3, 0]]
        self._reset()
        return out

    def take_all(self) -> np.ndarray:
        u = self.units[np.flatnonzero(self.live)]
        out = u[np.lexsort((u[:, 3], u[:, 2], u[:, 5], u[:, 1], u[:, 4]))]  # step, source, ord, doc_id, start
        self._reset()
        return out

    def _reset(self) -> None:
        self.head.fill(-1)
        self.tail.fill(-1)
        self.fen.fill(0)
        self.cnt.fill(0)
        self.top_len.fill(-1)
        self.live.fill(False)
        self.nxt.fill(-1)
        cap = len(self.units)
        self.free = np.arange(cap - 1, -1, -1, dtype=np.int64)
        self.meta[0] = cap

    def _state(self) -> tuple[Any, ...]:
        return (
            self.head, self.tail, self.fen, self.cnt, self.top_len, self.units, self.nxt, self.live, self.free,
            self.meta, self.n, self.top,
        )  # fmt: skip


# ---- kernels: plain Python that numba compiles; slots index self.units, Fenwick trees are 1-based ----


def _fen_add(fen: Any, base: int, n: int, i: int, delta: int) -> None:
    while i <= n:
        fen[base + i] += delta
        i += i & (-i)


def _longest_below(fen: Any, base: int, n: int, top: int, bound: int) -> int:
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


def _add_kernel(
    units: Any, head: Any, tail: Any, fen: Any, cnt: Any, top_len: Any, slots: Any, nxt: Any, live: Any,
    free: Any, meta: Any, n: int, top: int,
) -> None:  # fmt: skip
    nf = meta[0]
    for r in range(units.shape[0]):
        nf -= 1
        slot = free[nf]
        for c in range(6):
            slots[slot, c] = units[r, c]
        length, s = units[r, 0], units[r, 1]
        nxt[slot] = -1
        live[slot] = True
        key = s * n + length
        if tail[key] < 0:
            head[key] = slot
        else:
            nxt[tail[key]] = slot
        tail[key] = slot
        _fen_add(fen, s * (n + 1), n, length + 1, 1)
        cnt[s] += 1
        if length > top_len[s]:
            top_len[s] = length
    meta[0] = nf


def _fill_kernel(
    due: Any, seq_len: int, att: float, lin: float, segs: Any, counts: Any, placed: Any, order: Any, link: Any,
    head: Any, tail: Any, fen: Any, cnt: Any, top_len: Any, slots: Any, nxt: Any, live: Any, free: Any,
    meta: Any, n: int, top: int,
) -> int:  # fmt: skip
    """``mixing.pack.python_pool.UnitPool.fill`` and ``choose`` on arrays, decision for decision."""
    k = due.shape[0]
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
        for s in range(k):  # the longest unit that fits among sources behind, bringing them closer
            d = due[s]
            if d <= 0 or top_len[s] < best_len:  # empty, or cannot beat the best so far
                continue
            two = 2 * d
            bound = fit if fit < two else math.ceil(two)  # an integer l < 2d ⇔ l < ceil(2d)
            ln = top_len[s] if top_len[s] < bound else _longest_below(fen, s * (n + 1), n, top, bound)
            if ln >= 0 and (ln > best_len or (ln == best_len and d > best_due)):
                best, best_len, best_due = s, ln, d
        if best < 0:  # none: the longest that fits from any source, so that padding does not grow
            for s in range(k):
                if top_len[s] < best_len:
                    continue
                ln = top_len[s] if top_len[s] < fit else _longest_below(fen, s * (n + 1), n, top, fit)
                if ln >= 0 and (ln > best_len or (ln == best_len and due[s] > best_due)):
                    best, best_len, best_due = s, ln, due[s]
        if best < 0:
            break
        key = best * n + best_len  # take the earliest planned unit of that source and length
        slot = head[key]
        head[key] = nxt[slot]
        if nxt[slot] < 0:
            tail[key] = -1
        _fen_add(fen, best * (n + 1), n, best_len + 1, -1)
        cnt[best] -= 1
        if best_len == top_len[best] and head[key] < 0:  # its longest are gone: find the next longest
            top_len[best] = _longest_below(fen, best * (n + 1), n, top, n)
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
        c = b_cost[at] + _cost(att, lin, length * length, length)
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


# the one cost formula (contract.cost), compiled with the kernels; numba's cache of the kernels does not notice
# a change to that file: clear mixing/pack/__pycache__ after changing the formula
_cost = cost_formula
_kernels: tuple[Any, Any] | None = None
_compiling = threading.Lock()


def _compiled() -> tuple[Any, Any]:
    """The add and fill kernels as numba dispatchers, made on the first call in a process (numba imported then).
    The helpers they call are made dispatchers first: numba reads a kernel's globals when it compiles it."""
    global _cost, _fen_add, _longest_below, _kernels
    with _compiling:
        if _kernels is None:
            from numba import njit

            _cost = njit(cache=True, nogil=True)(_cost)
            _fen_add = njit(cache=True, nogil=True)(_fen_add)
            _longest_below = njit(cache=True, nogil=True)(_longest_below)
            _kernels = njit(cache=True, nogil=True)(_add_kernel), njit(cache=True, nogil=True)(_fill_kernel)
        return _kernels
