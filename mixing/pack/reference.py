"""The reference packer: weir's first, pure-Python implementation, kept as it was written (its cost of a
unit is the shared :class:`~mixing.format.cost.CostModel`'s).

:mod:`mixing.pack.packing` packs with the same algorithm (and, without numba, with this module's ``_Pool``
and ``_Bins``); ``benchmarks/packing.py`` and the tests compare it against this one, which must give the
same packing for the same plan. Its ``pack_plan`` fetches every unit into Python tuples at once (about
575 bytes per unit at its peak): use :func:`mixing.pack.packing.pack_plan` instead.

The algorithm (mixture-steered best-fit decreasing, carry within a phase, drops at phase ends) is described
once, in :mod:`mixing.pack.packing`'s docstring; this module is its first implementation, unchanged. Cost:
O(n log n + n·(k + log B)) per step for n units in the pool, k sources and B bins (bisects over sorted
lists); deterministic for the same plan (ties broken by length, due tokens, source, step, draw order, then
bin index).
"""

from __future__ import annotations

import bisect
from bisect import bisect_left as _bisect_left
from bisect import bisect_right as _bisect_right
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import numpy as np

from mixing.format.cost import CostModel, cost_formula

if TYPE_CHECKING:  # the result type is the current packer's (imported late: mixing.pack.packing imports this module)
    from mixing.pack.packing import Packing

__all__ = ["pack_plan", "pack_units"]

# A unit inside the packer: (length, planned step, ord, source index, doc_id, start). Tuples keep the hot
# loop cheap, and their natural order is the candidates' order: by length, then earliest planned.
Unit = tuple[int, int, int, int, int, int]


def pack_plan(db_path: Path, seq_len: int, global_batch: int, cost: CostModel = CostModel()) -> Packing:
    """Pack ``plan_units`` against ``plan_quotas`` from the build's DuckDB file; deterministic for the same plan."""
    with duckdb.connect(str(db_path), read_only=True) as con:
        sources = tuple(r[0] for r in con.sql("SELECT DISTINCT source FROM plan_quotas ORDER BY 1").fetchall())
        steps = con.sql("SELECT step, any_value(phase) FROM plan_quotas GROUP BY 1 ORDER BY 1").fetchall()
        q = con.sql("SELECT step, source, quota FROM plan_quotas").fetchnumpy()
        rows = con.sql(
            "SELECT length, source, doc_id, start, step, ord FROM plan_units ORDER BY step, source, ord"
        ).fetchnumpy()
    src_idx = {s: i for i, s in enumerate(sources)}
    src = np.array([src_idx[s] for s in rows["source"]], dtype=np.int64)
    cols = [rows["length"], src, rows["doc_id"], rows["start"], rows["step"], rows["ord"]]
    units = np.stack([np.asarray(c, dtype=np.int64).reshape(-1) for c in cols], axis=1)
    row = {int(s): i for i, (s, _p) in enumerate(steps)}
    quotas = np.zeros((len(steps), len(sources)), dtype=np.float64)
    quotas[[row[int(s)] for s in q["step"]], [src_idx[s] for s in q["source"]]] = np.asarray(q["quota"], np.float64)
    step_list = [(int(s), str(p)) for s, p in steps]
    return pack_units(units, step_list, sources, seq_len, global_batch, cost, quotas=quotas)


def pack_units(
    units: np.ndarray,
    steps: list[tuple[int, str]],
    sources: tuple[str, ...],
    seq_len: int,
    global_batch: int,
    cost: CostModel = CostModel(),
    quotas: np.ndarray | None = None,
) -> Packing:
    """Pack ``units`` int64 [n, 6] = (length, source index, doc_id, start, step, ord), each length ≤ S.

    ``steps`` lists (step, phase) in order; every step gets exactly ``global_batch`` sequences.
    ``quotas`` [len(steps), len(sources)]: planned tokens per step (row i is ``steps[i]``) and source, the
    shares the realized mixture tracks; by default the units' own lengths per planned step.
    """
    if len(units) and int(units[:, 0].max()) > seq_len:
        raise ValueError(f"a unit of {int(units[:, 0].max())} tokens is longer than S={seq_len}")
    row = {s: i for i, (s, _p) in enumerate(steps)}
    n_src = len(sources)
    by_step: dict[int, list[Unit]] = {}
    for u in units[:, [0, 4, 5, 1, 2, 3]].tolist():
        by_step.setdefault(row[u[1]], []).append(tuple(u))  # type: ignore[arg-type]
    if quotas is None:
        quotas = np.zeros((len(steps), n_src))
        if len(units):
            step_rows = np.array([row[s] for s in units[:, 4].tolist()], dtype=np.int64)
            np.add.at(quotas, (step_rows, units[:, 1]), units[:, 0])
    quotas = np.asarray(quotas, dtype=np.float64).reshape(len(steps), n_src)
    cap = float(seq_len * global_batch)
    seq_step: list[int] = []
    seg_counts: list[int] = []
    segments: list[tuple[int, int, int, int]] = []
    dropped: list[tuple[int, int, int, int]] = []
    pool = _Pool(n_src)
    q_cum = np.zeros(n_src)
    r_cum = np.zeros(n_src)
    for i, (step, phase) in enumerate(steps):
        if i == 0 or steps[i - 1][1] != phase:  # a phase starts: its own pool and its own shares
            q_cum[:], r_cum[:] = 0.0, 0.0
            pool.add(by_step.get(i, []))
        last_of_phase = i + 1 == len(steps) or steps[i + 1][1] != phase
        if not last_of_phase:
            pool.add(by_step.get(i + 1, []))  # lookahead: the next step's units may fill gaps
        q_cum += quotas[i]
        total = q_cum.sum()
        want = q_cum * ((r_cum.sum() + cap) / total) - r_cum if total > 0 else np.full(n_src, cap / max(n_src, 1))
        bins = _Bins(global_batch, seq_len, cost)
        r_cum += pool.fill(bins, want.tolist())
        for b in bins.items:
            seq_step.append(step)
            seg_counts.append(len(b))
            segments.extend((u[3], u[4], u[5], u[0]) for u in b)
        if last_of_phase:
            dropped.extend((u[3], u[4], u[5], u[0]) for u in sorted(pool.drain(), key=lambda u: (u[3], u[1], u[2])))
    from mixing.pack.packing import Packing

    return Packing(
        sources=sources,
        seq_len=seq_len,
        seq_step=np.asarray(seq_step, dtype=np.int64),
        seg_offsets=np.concatenate([[0], np.cumsum(seg_counts, dtype=np.int64)]).astype(np.int64),
        segments=np.asarray(segments, dtype=np.int64).reshape(-1, 4),
        dropped=np.asarray(dropped, dtype=np.int64).reshape(-1, 4),
        cost=cost,
    )


class _Bins:
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


class _Pool:
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

    def fill(self, bins: _Bins, want: list[float]) -> np.ndarray:
        """Fill ``bins`` from the pool given each source's due tokens ``want``; return tokens placed per
        source (float64 [n_src]). Placed units leave the pool."""
        due = list(want)
        placed = np.zeros(len(due))
        while (free := bins.max_free) > 0:
            s, j = _choose(self.lens, due, free)
            if s < 0:
                break
            u = self.units[s].pop(j)
            del self.lens[s][j]
            bins.place(u)
            placed[s] += u[0]
            due[s] -= u[0]
        return placed


def _choose(lens: list[list[int]], due: list[float], free: int) -> tuple[int, int]:
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
        j = _bisect_left(ls, fit if fit < 2 * d else 2 * d) - 1
        if j >= 0 and (ls[j] > best_len or (ls[j] == best_len and d > best_due)):
            best, best_len, best_due = s, ls[j], d
    if best < 0:
        for s, ls in enumerate(lens):
            j = _bisect_right(ls, free) - 1
            if j >= 0 and (ls[j] > best_len or (ls[j] == best_len and due[s] > best_due)):
                best, best_len, best_due = s, ls[j], due[s]
    if best < 0:
        return -1, -1
    return best, _bisect_left(lens[best], best_len)
