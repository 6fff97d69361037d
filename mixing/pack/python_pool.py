"""The ``"python"`` packing engine: the packer's inner loop in plain Python, where numba is not installed.

About 10 µs per unit (the ``"compiled"`` engine of :mod:`mixing.pack.pool`, 0.3 µs). It makes the same
decisions as the compiled kernels, unit for unit (``tests/mixing/pack/test_packing_scale.py`` holds both to the
reference packer). Units are tuples (length, planned step, ord, source index, doc_id, start), whose natural
order is the candidates' order: by length, then earliest planned. Deterministic: ties broken by length, due
tokens, source, step, draw order, then bin index.
"""

from __future__ import annotations

import bisect

import numpy as np

from contract.cost import CostModel, cost_formula

__all__ = ["Bins", "PythonPool", "Unit", "UnitPool", "choose"]

# A unit inside the packer: (length, planned step, ord, source index, doc_id, start). Tuples keep the hot
# loop cheap, and their natural order is the candidates' order: by length, then earliest planned.
Unit = tuple[int, int, int, int, int, int]


class PythonPool:
    """The pure-Python engine behind :class:`mixing.pack.pool.Pool`'s interface: a :class:`UnitPool` filling
    :class:`Bins`."""

    def __init__(self, n_src: int, seq_len: int, cost: CostModel) -> None:
        self.pool = UnitPool(n_src)
        self.seq_len, self.cost = seq_len, cost

    def add(self, units: np.ndarray) -> None:
        self.pool.add([tuple(u) for u in units[:, [0, 4, 5, 1, 2, 3]].tolist()])  # type: ignore[misc]

    def __len__(self) -> int:
        return sum(len(us) for us in self.pool.units)

    def fill(self, want: np.ndarray, segs: np.ndarray, counts: np.ndarray) -> tuple[int, np.ndarray]:
        bins = Bins(len(counts), self.seq_len, self.cost)
        placed = self.pool.fill(bins, want.tolist())
        counts[:] = [len(b) for b in bins.items]
        rows = [(u[3], u[4], u[5], u[0]) for b in bins.items for u in b]
        segs[: len(rows)] = np.asarray(rows, dtype=np.int64).reshape(-1, 4)
        return len(rows), placed

    def drain(self) -> np.ndarray:
        left = sorted(self.pool.drain(), key=lambda u: (u[3], u[1], u[2]))
        return np.asarray([(u[3], u[4], u[5], u[0]) for u in left], dtype=np.int64).reshape(-1, 4)

    def take_all(self) -> np.ndarray:
        left = sorted(self.pool.drain(), key=lambda u: (u[1], u[3], u[2], u[4], u[5]))  # step, source, ord, doc, start
        return np.asarray([(u[0], u[3], u[4], u[5], u[1], u[2]) for u in left], dtype=np.int64).reshape(-1, 6)


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
    """A phase's unplaced units, per source, sorted (length, plan order), with their lengths to bisect."""

    def __init__(self, n_src: int) -> None:
        self.units: list[list[Unit]] = [[] for _ in range(n_src)]
        self.lens: list[list[int]] = [[] for _ in range(n_src)]

    def add(self, units: list[Unit]) -> None:
        new: dict[int, list[Unit]] = {}
        for u in units:
            new.setdefault(u[3], []).append(u)
        for s, us in new.items():
            self.units[s] = sorted(self.units[s] + us)  # two sorted runs: timsort merges them in O(n)
            self.lens[s] = [u[0] for u in self.units[s]]

    def drain(self) -> list[Unit]:
        out = [u for us in self.units for u in us]
        self.units = [[] for _ in self.units]
        self.lens = [[] for _ in self.lens]
        return out

    def fill(self, bins: Bins, want: list[float]) -> np.ndarray:
        """Fill ``bins`` from the pool given each source's due tokens ``want``; return tokens placed per
        source (float64 [n_src]). Placed units leave the pool."""
        due = list(want)
        placed = np.zeros(len(due))
        while (free := bins.max_free) > 0:
            s, j = choose(self.lens, due, free)
            if s < 0:
                break
            u = self.units[s].pop(j)
            del self.lens[s][j]
            bins.place(u)
            placed[s] += u[0]
            due[s] -= u[0]
        return placed


def choose(lens: list[list[int]], due: list[float], free: int) -> tuple[int, int]:
    """(source, index into its length-sorted candidates) of the next unit to place; (-1, -1) if none fits.

    Best fit decreasing, steered by the mixture: the longest unit that fits (≤ ``free``, the largest free
    space) among the sources still behind their due tokens, counting only units that bring their source
    closer to it (length < 2·due). Only when no such unit exists, the longest unit that fits from any
    source, so that padding does not grow; the next steps' dues make up for it. Ties: the source further
    behind, then the lower index; among equally long units the earliest planned.
    """
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
        for s, ls in enumerate(lens):
            j = bisect.bisect_right(ls, free) - 1
            if j >= 0 and (ls[j] > best_len or (ls[j] == best_len and due[s] > best_due)):
                best, best_len, best_due = s, ls[j], due[s]
    if best < 0:
        return -1, -1
    return best, bisect.bisect_left(lens[best], best_len)
