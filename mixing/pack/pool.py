"""The packer's inner loop: a phase's pool of unplaced units, and filling one step's bins from it.

Two engines with one interface and the same results, unit for unit (the tests hold them to it):

- ``"compiled"`` (:class:`CompiledPool`, needs numba; its kernels are :mod:`mixing.pack.kernels`): the pool
  as flat arrays — per source and length a FIFO of units (in plan order) and a Fenwick tree of counts over
  lengths, so "the longest unit of source s shorter than x" costs O(log S) and taking it O(1); the urgent
  units (carried too long, :mod:`mixing.pack.phase_end`: the first of their FIFOs, being the oldest) counted
  apart per length and per block of 64 lengths; the bins as arrays kept sorted by (free, cost, bin). About
  0.3 µs per unit in one thread, without the GIL.
- ``"python"`` (:class:`~mixing.pack.python_pool.PythonPool`, :mod:`mixing.pack.python_pool`), about 10 µs
  per unit: the fallback where numba is not installed.

A third engine, ``"interpreted"``, runs the compiled engine's kernels in the Python interpreter (about as
slow as ``"python"``): the tests check the kernels with it where numba is not installed.

The compiled kernels are cached by numba (``__pycache__``, or its user-wide cache where that is read-only):
the first call in a process loads them (about a second), or compiles them once (a few seconds).

Both hold only the units handed to them (a phase's carry plus two steps), never the whole plan.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from contract.cost import CostModel
from mixing.pack import kernels
from mixing.pack.python_pool import PythonPool

__all__ = ["ENGINES", "CompiledPool", "Pool", "PythonPool", "default_engine", "make_pool"]

ENGINES = ("compiled", "python")
_NEVER = -(1 << 62)  # a step before every plan's


class Pool(Protocol):
    """A phase's unplaced units. Units are int64 rows (length, source index, doc_id, start, step, ord)."""

    def add(self, units: np.ndarray) -> None:
        """Add one step's units, sorted by (source, ord, doc_id, start); steps come in increasing order."""

    def __len__(self) -> int:
        """Units in the pool."""
        ...

    def age(self, step: int) -> None:
        """The units planned at or before ``step`` become urgent: the next fills place them first. ``step``
        never decreases until the pool is drained."""

    def held(self) -> np.ndarray:
        """The units in the pool, int64 [n, 6] rows, in (source, step, ord, doc_id, start) order."""
        ...

    def remove(self, mask: np.ndarray) -> None:
        """Take out the units of :meth:`held` (same order) whose ``mask`` (bool [n]) entry is true."""

    def fill(self, want: np.ndarray, segs: np.ndarray, counts: np.ndarray) -> tuple[int, np.ndarray]:
        """Fill ``len(counts)`` fresh bins given each source's due tokens ``want`` (float64 [k]); placed
        units leave the pool. Each next unit is the longest that fits among the sources behind that it brings
        closer to their due (length < 2·due), an urgent one first; where there is none, the longest that fits
        whatever the dues, an urgent one first (ties: the source further behind, the lower source, the earliest
        planned; :meth:`mixing.pack.python_pool.UnitPool.fill`). Writes units per bin into ``counts`` and the
        placed units into ``segs`` (room for ``len(self)`` rows) as (source, doc_id, start, length), bin by bin
        in placement order. Returns (units placed, tokens placed per source float64 [k])."""
        ...

    def drain(self) -> np.ndarray:
        """Empty the pool: its units as int64 [n, 6] rows ordered by (source, step, ord, length, doc_id, start)."""
        ...


def default_engine() -> str:
    """``"compiled"`` where numba is installed, else ``"python"``."""
    return "compiled" if kernels.COMPILED else "python"


def make_pool(engine: str, n_src: int, seq_len: int, cost: CostModel, *, ageing: bool = True) -> Pool:
    """An empty pool of ``engine``; ``ageing=False``: one whose :meth:`Pool.age` is never called (it keeps no
    record of what it would age)."""
    if engine == "compiled":
        if not kernels.COMPILED:
            raise ValueError("the compiled packing engine needs numba, which is not installed")
        return CompiledPool(n_src, seq_len, cost, ageing=ageing)
    if engine == "python":
        return PythonPool(n_src, seq_len, cost, ageing=ageing)
    if engine == "interpreted":
        return CompiledPool(n_src, seq_len, cost, interpreted=True, ageing=ageing)
    raise ValueError(f"unknown packing engine {engine!r}; one of {ENGINES} (or 'interpreted', for tests)")


class CompiledPool:
    """The pool as arrays for the numba kernels of :mod:`mixing.pack.kernels` (see the module docstring).

    Ageing is lazy: :meth:`age` records the step, and the next fill first counts the units planned up to it
    as urgent, walking a ring of the units added in order (so no unit is looked at twice).
    """

    def __init__(
        self, n_src: int, seq_len: int, cost: CostModel, *, interpreted: bool = False, ageing: bool = True
    ) -> None:
        run: dict[str, Any] = {f.__name__: f for f in (kernels.add_units, kernels.remove_units, kernels.fill_bins)}
        if not interpreted:
            run = kernels.COMPILED
        self.add_kernel, self.remove_kernel, self.fill_kernel = run["add_units"], run["remove_units"], run["fill_bins"]
        self.k, self.seq_len = n_src, seq_len
        self.att, self.lin = float(cost.attention), float(cost.linear)
        self.n = seq_len + 1  # Fenwick positions 1..S+1 hold lengths 0..S
        self.top = 1 << (self.n.bit_length() - 1)  # the largest power of two ≤ n, for Fenwick searches
        self.head = np.full(n_src * self.n, -1, np.int64)  # per (source, length): first unit's slot
        self.tail = np.full(n_src * self.n, -1, np.int64)
        self.fen = np.zeros(n_src * (self.n + 1), np.int64)  # per source: a Fenwick tree of counts per length
        # the urgent units, the first of their FIFOs (they are the oldest), counted per (source, length) and per
        # (source, block of 64 lengths): cheap to count, and few enough to search by blocks
        self.ucnt = np.zeros(n_src * self.n, np.int64)
        self.ublk = np.zeros(n_src * (self.n // 64 + 1), np.int64)
        self.cnt = np.zeros(2 * n_src, np.int64)  # units per source, then urgent units per source
        self.top_len = np.full(2 * n_src, -1, np.int64)  # the longest length of each, -1 if none
        self.bot_len = np.full(2 * n_src, self.n, np.int64)  # the shortest urgent length per source, n if none
        self.units = np.zeros((0, 6), np.int64)  # slot → (length, source, doc_id, start, step, ord)
        self.nxt = np.zeros(0, np.int64)  # slot → next slot of its FIFO, -1 at the end
        self.serial = np.zeros(0, np.int64)  # slot → its unit's serial (units are numbered as added)
        self.live = np.zeros(0, np.bool_)
        self.free = np.zeros(0, np.int64)  # stack of free slots, the first meta[0] entries
        # the units added and not yet aged, at their serial mod its size (a power of two): slots and steps
        self.log = np.zeros(0, np.int64)
        self.log_step = np.zeros(0, np.int64)
        # free slots, urgent units, next serial, the step aged to, first serial not yet aged
        self.meta = np.array([0, 0, 0, _NEVER, 0], np.int64)
        self.ageing = ageing  # without it the ring stays empty and the kernels skip it
        self.order = np.zeros(0, np.int64)  # scratch for one fill: placements' slots and their bins' chains
        self.link = np.zeros(0, np.int64)
        self.last_held = np.zeros(0, np.int64)  # the slots ``held`` listed, until the pool changes

    def _grow(self, need: int) -> None:
        cap = len(self.units)
        new = max(2 * cap, cap + need, 1024)
        self.units = np.concatenate([self.units, np.zeros((new - cap, 6), np.int64)])
        self.nxt = np.concatenate([self.nxt, np.full(new - cap, -1, np.int64)])
        self.serial = np.concatenate([self.serial, np.zeros(new - cap, np.int64)])
        self.live = np.concatenate([self.live, np.zeros(new - cap, np.bool_)])
        nf = int(self.meta[0])
        free = np.empty(new, np.int64)
        free[: new - cap] = np.arange(new - 1, cap - 1, -1)  # new slots at the bottom: reused last
        free[new - cap : new - cap + nf] = self.free[:nf]
        self.free, self.meta[0] = free, nf + new - cap
        self.order, self.link = np.zeros(new, np.int64), np.zeros(new, np.int64)

    def _grow_log(self, need: int) -> None:
        lo, hi = int(self.meta[4]), int(self.meta[2])
        size = max(2 * len(self.log), 1 << (need - 1).bit_length(), 1024)  # a power of two: a mask, not a modulo
        at = np.arange(lo, hi)
        log, log_step = np.zeros(size, np.int64), np.zeros(size, np.int64)
        if len(at):
            log[at % size], log_step[at % size] = self.log[at % len(self.log)], self.log_step[at % len(self.log)]
        self.log, self.log_step = log, log_step

    def add(self, units: np.ndarray) -> None:
        if not len(units):
            return
        if self.meta[0] < len(units):
            self._grow(len(units) - int(self.meta[0]))
        if self.ageing and self.meta[2] - self.meta[4] + len(units) > len(self.log):
            self._grow_log(int(self.meta[2] - self.meta[4]) + len(units))
        self.last_held = self.last_held[:0]
        self.add_kernel(np.ascontiguousarray(units, np.int64), *self._state())

    def __len__(self) -> int:
        return len(self.units) - int(self.meta[0])

    def age(self, step: int) -> None:
        if not self.ageing:
            raise ValueError("this pool was made without ageing")
        self.meta[3] = max(int(self.meta[3]), step)  # the next fill counts them as urgent, then places them

    def _held_slots(self) -> np.ndarray:
        slots = np.flatnonzero(self.live)
        u = self.units[slots]
        return slots[np.lexsort((u[:, 3], u[:, 2], u[:, 5], u[:, 4], u[:, 1]))]  # type: ignore[no-any-return]

    def held(self) -> np.ndarray:
        self.last_held = self._held_slots()
        return self.units[self.last_held]

    def remove(self, mask: np.ndarray) -> None:
        listed = self.last_held if len(self.last_held) == len(self) else self._held_slots()
        self.last_held = self.last_held[:0]
        self.remove_kernel(np.ascontiguousarray(listed[np.asarray(mask, np.bool_)]), self.k, *self._state())

    def fill(self, want: np.ndarray, segs: np.ndarray, counts: np.ndarray) -> tuple[int, np.ndarray]:
        placed = np.zeros(self.k, np.float64)
        due = np.array(want, dtype=np.float64)
        self.last_held = self.last_held[:0]
        m = self.fill_kernel(
            due, self.seq_len, self.att, self.lin, segs, counts, placed, self.order, self.link, *self._state()
        )
        return int(m), placed

    def drain(self) -> np.ndarray:
        self.last_held = self.last_held[:0]
        u = self.units[np.flatnonzero(self.live)]
        out = u[np.lexsort((u[:, 3], u[:, 2], u[:, 0], u[:, 5], u[:, 4], u[:, 1]))]  # source, step, ord, len
        self.head.fill(-1)
        self.tail.fill(-1)
        self.fen.fill(0)
        self.ucnt.fill(0)
        self.ublk.fill(0)
        self.cnt.fill(0)
        self.top_len.fill(-1)
        self.bot_len.fill(self.n)
        self.live.fill(False)
        self.nxt.fill(-1)
        cap = len(self.units)
        self.free = np.arange(cap - 1, -1, -1, dtype=np.int64)
        self.meta[0], self.meta[1], self.meta[3], self.meta[4] = cap, 0, _NEVER, self.meta[2]
        return out  # type: ignore[no-any-return]

    def _state(self) -> tuple[Any, ...]:
        return (
            self.head, self.tail, self.fen, self.ucnt, self.ublk, self.cnt, self.top_len, self.bot_len, self.units,
            self.nxt, self.serial, self.live, self.free, self.log, self.log_step, self.meta, self.n, self.top,
        )  # fmt: skip
