"""The ``"python"`` packing engine: the packer's inner loop in plain Python, where numba is not installed.

About 10 µs per unit (the ``"compiled"`` engine of :mod:`mixing.pack.pool`, 0.3 µs). It makes the same
decisions as the compiled kernels, unit for unit (``tests/mixing/pack/test_packing_scale.py`` holds both to the
reference packer). Units are tuples (length, planned step, ord, source index, doc_id, start), whose natural
order is the candidates' order: by length, then earliest planned. Each source's units are in two tiers: the
urgent ones (carried too long, :mod:`mixing.pack.phase_end`), placed first, and the others. Deterministic:
ties broken by length, due tokens, source, step, draw order, then bin index.
"""

from __future__ import annotations

import bisect
from collections import Counter

import numpy as np

from contract.cost import CostModel, cost_formula

__all__ = ["Bins", "PythonPool", "Unit", "UnitPool", "choose", "closer", "longest"]

# A unit inside the packer: (length, planned step, ord, source index, doc_id, start). Tuples keep the hot
# loop cheap, and their natural order is the candidates' order: by length, then earliest planned.
Unit = tuple[int, int, int, int, int, int]


class PythonPool:
    """The pure-Python engine behind :class:`mixing.pack.pool.Pool`'s interface: a :class:`UnitPool` filling
    :class:`Bins`."""

    def __init__(self, n_src: int, seq_len: int, cost: CostModel, *, ageing: bool = True) -> None:
        self.pool = UnitPool(n_src)
        self.seq_len, self.cost, self.ageing = seq_len, cost, ageing

    def add(self, units: np.ndarray) -> None:
        self.pool.add([tuple(u) for u in units[:, [0, 4, 5, 1, 2, 3]].tolist()])  # type: ignore[misc]

    def __len__(self) -> int:
        return sum(len(us) for us in self.pool.units) + sum(len(us) for us in self.pool.urgent)

    def age(self, step: int) -> None:
        if not self.ageing:
            raise ValueError("this pool was made without ageing")
        self.pool.age(step)

    def held(self) -> np.ndarray:
        return _rows(self.pool.held())

    def remove(self, mask: np.ndarray) -> None:
        self.pool.remove(mask.tolist())

    def fill(self, want: np.ndarray, segs: np.ndarray, counts: np.ndarray) -> tuple[int, np.ndarray]:
        bins = Bins(len(counts), self.seq_len, self.cost)
        placed = self.pool.fill(bins, want.tolist())
        counts[:] = [len(b) for b in bins.items]
        rows = [(u[3], u[4], u[5], u[0]) for b in bins.items for u in b]
        segs[: len(rows)] = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
        return len(rows), placed

    def drain(self) -> np.ndarray:
        return _rows(sorted(self.pool.drain(), key=lambda u: (u[3], u[1], u[2], u[0], u[4], u[5])))


def _rows(units: list[Unit]) -> np.ndarray:
    """Units as int64 [n, 6] rows (length, source, doc_id, start, step, ord)."""
    return np.asarray([(u[0], u[3], u[4], u[5], u[1], u[2]) for u in units], dtype=np.int64).reshape(-1, 6)


class Bins:
    """``n`` bins of ``seq_len`` slots; ``slots`` is sorted by (free, cost, bin) for best-fit bisects."""

    def __init__(self, n: int, seq_len: int, cost: CostModel) -> None:
        self.slots: list[tuple[int, float, int]] = [(seq_len, 0.0, b) for b in range(n)]
        self.items: list[list[Unit]] = [[] for _ in range(n)]
        self.att, self.lin = cost.attention, cost.linear

    def place(self, u: Unit) -> bool:
        """Put ``u`` into the tightest bin that holds it (lowest cost among equal fits); False if none."""
        k = bisect.bisect_left(self.slots, (u[0], -1.0, -1))
        if k == len(self.slots):
            return False
        free, c, b = self.slots.pop(k)
        self.items[b].append(u)
        bisect.insort(self.slots, (free - u[0], c + cost_formula(self.att, self.lin, u[0] * u[0], u[0]), b))
        return True

    @property
    def max_free(self) -> int:
        return self.slots[-1][0] if self.slots else 0


class UnitPool:
    """A phase's unplaced units, per source and tier (urgent or not), sorted (length, plan order), with their
    lengths to bisect."""

    def __init__(self, n_src: int) -> None:
        self.units: list[list[Unit]] = [[] for _ in range(n_src)]
        self.lens: list[list[int]] = [[] for _ in range(n_src)]
        self.urgent: list[list[Unit]] = [[] for _ in range(n_src)]  # planned at or before ``aged``: placed first
        self.ulens: list[list[int]] = [[] for _ in range(n_src)]
        self.aged = -(1 << 62)

    def add(self, units: list[Unit]) -> None:
        """Add one step's units (a later step than those already held, planned after ``aged``)."""
        new: dict[int, list[Unit]] = {}
        for u in units:
            new.setdefault(u[3], []).append(u)
        for s, us in new.items():
            self.units[s] = sorted(self.units[s] + us)  # two sorted runs: timsort merges them in O(n)
            self.lens[s] = [u[0] for u in self.units[s]]

    def age(self, step: int) -> None:
        """Units planned at or before ``step`` become urgent (``step`` never decreases within a phase)."""
        self.aged = max(self.aged, step)
        for s, us in enumerate(self.units):
            old = [u for u in us if u[1] <= step]
            if old:
                self.units[s] = [u for u in us if u[1] > step]
                self.lens[s] = [u[0] for u in self.units[s]]
                self.urgent[s] = sorted(self.urgent[s] + old)
                self.ulens[s] = [u[0] for u in self.urgent[s]]

    def held(self) -> list[Unit]:
        """The units held, in (source, step, ord, doc_id, start) order."""
        return sorted((u for us in (*self.units, *self.urgent) for u in us), key=_plan_order)

    def remove(self, mask: list[bool]) -> None:
        """Take out the units of :meth:`held` whose ``mask`` entry is true."""
        gone = Counter(u for u, m in zip(self.held(), mask, strict=True) if m)
        for tier, lens in ((self.units, self.lens), (self.urgent, self.ulens)):
            for s, us in enumerate(tier):
                kept = []
                for u in us:
                    if gone[u]:
                        gone[u] -= 1
                    else:
                        kept.append(u)
                tier[s], lens[s] = kept, [u[0] for u in kept]

    def drain(self) -> list[Unit]:
        out = [u for us in (*self.units, *self.urgent) for u in us]
        n = len(self.units)
        self.units, self.lens = [[] for _ in range(n)], [[] for _ in range(n)]
        self.urgent, self.ulens = [[] for _ in range(n)], [[] for _ in range(n)]
        self.aged = -(1 << 62)
        return out

    def fill(self, bins: Bins, want: list[float]) -> np.ndarray:
        """Fill ``bins`` from the pool given each source's due tokens ``want``; return tokens placed per source
        (float64 [n_src]). Placed units leave the pool. Each next unit: by :func:`closer`, from the urgent units,
        else from the others; where neither has one, by :func:`longest`, from the urgent units, else from the
        others. So the urgent units go first, in the limits of the dues, and fill what gaps are left first."""
        due = list(want)
        placed = np.zeros(len(due))
        urgent = sum(map(len, self.urgent))
        while (free := bins.max_free) > 0:
            for pick, units, lens in (
                (closer, self.urgent, self.ulens),
                (closer, self.units, self.lens),
                (longest, self.urgent, self.ulens),
                (longest, self.units, self.lens),
            ):
                if units is self.urgent and not urgent:
                    continue
                s, j = pick(lens, due, free)
                if s >= 0:
                    break
            if s < 0:
                break
            urgent -= units is self.urgent
            u = units[s].pop(j)
            del lens[s][j]
            bins.place(u)
            placed[s] += u[0]
            due[s] -= u[0]
        return placed


def _plan_order(u: Unit) -> tuple[int, int, int, int, int]:
    return u[3], u[1], u[2], u[4], u[5]  # source, step, ord, doc_id, start


def choose(lens: list[list[int]], due: list[float], free: int) -> tuple[int, int]:
    """(source, index into its length-sorted candidates) of the next unit to place; (-1, -1) if none fits.

    Best fit decreasing, steered by the mixture: the longest unit that fits (≤ ``free``, the largest free
    space) among the sources still behind their due tokens, counting only units that bring their source
    closer to it (length < 2·due). Only when no such unit exists, the longest unit that fits from any
    source, so that padding does not grow; the next steps' dues make up for it. Ties: the source further
    behind, then the lower index; among equally long units the earliest planned.
    """
    s, j = closer(lens, due, free)
    return (s, j) if s >= 0 else longest(lens, due, free)


def closer(lens: list[list[int]], due: list[float], free: int) -> tuple[int, int]:
    """:func:`choose`'s first rule alone: the longest unit that fits among the sources behind their due tokens
    that brings its source closer to them (length < 2·due); (-1, -1) if none. Ties as :func:`choose`'s."""
    best, best_len, best_due = -1, 0, 0.0
    fit = free + 1
    for s, ls in enumerate(lens):
        d = due[s]
        if d <= 0 or not ls:
            continue
        j = bisect.bisect_left(ls, fit if fit < 2 * d else 2 * d) - 1
        if j >= 0 and (ls[j] > best_len or (ls[j] == best_len and d > best_due)):
            best, best_len, best_due = s, ls[j], d
    if best < 0:
        return -1, -1
    return best, bisect.bisect_left(lens[best], best_len)


def longest(lens: list[list[int]], due: list[float], free: int) -> tuple[int, int]:
    """(source, index into its length-sorted candidates) of the longest unit that fits (≤ ``free``) from any
    source, whatever the due tokens; (-1, -1) if none. Ties: the source further behind, then the lower index;
    among equally long units the earliest planned."""
    best, best_len, best_due = -1, 0, 0.0
    for s, ls in enumerate(lens):
        j = bisect.bisect_right(ls, free) - 1
        if j >= 0 and (ls[j] > best_len or (ls[j] == best_len and due[s] > best_due)):
            best, best_len, best_due = s, ls[j], due[s]
    if best < 0:
        return -1, -1
    return best, bisect.bisect_left(lens[best], best_len)
