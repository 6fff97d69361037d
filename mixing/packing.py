"""Packing a plan's units into fixed-length sequences, step by step, never across a phase boundary.

Each step has ``global_batch`` sequences (bins) of ``S`` token slots. Units (whole documents, or the
S-sized pieces the plan cut from documents longer than S, and only those) are placed **best-fit
decreasing**: longest first, each into the bin whose free space is the smallest that still holds it.
Among bins with that same free space, the one whose attention cost so far is the lowest wins, so the
sequences' costs come out more even for the sampler that later balances whole sequences across ranks.

A unit that fits nowhere is carried into the next step of the same phase; gaps left at a step are then
filled best-fit from the next step's units (longest first), so the carry never grows. Units still carried
at the end of a phase are dropped and reported per source. A unit is never split here: ``truncated_docs``
is 0 by construction.

Cost: O(n log n + n log B) per step for n units and B bins (a bisect over a sorted list of free space);
deterministic for the same plan (ties broken by step, source, draw order, then bin index).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

__all__ = ["Packing", "pack_plan", "pack_units"]

# A unit: (length, source index, doc_id, start, planned step, ord). Tuples keep the hot loop cheap.
Unit = tuple[int, int, int, int, int, int]


@dataclass(frozen=True)
class Packing:
    """Sequences in step order.

    ``seq_step`` int64 [n_seq]; ``seg_offsets`` int64 [n_seq+1] into ``segments``; ``segments`` int64
    [n_seg, 4] = (source index, doc_id, start, length) in placement order inside each sequence.
    ``dropped`` int64 [n_drop, 4] in the same layout. ``sources`` names the source indices.
    ``cost`` = (attention, linear): a unit of l tokens costs attention·l² + linear·l.
    """

    sources: tuple[str, ...]
    seq_len: int
    seq_step: np.ndarray
    seg_offsets: np.ndarray
    segments: np.ndarray
    dropped: np.ndarray
    cost: tuple[float, float] = (1.0, 0.0)

    @property
    def seg_cost(self) -> np.ndarray:
        """float64 [n_seg]: the cost of each segment."""
        length = self.segments[:, 3].astype(np.float64)
        return self.cost[0] * length * length + self.cost[1] * length

    @property
    def seq_cost(self) -> np.ndarray:
        """float64 [n_seq]: Σ segment cost per sequence."""
        cum = np.concatenate([[0.0], np.cumsum(self.seg_cost)])
        return cum[self.seg_offsets[1:]] - cum[self.seg_offsets[:-1]]

    @property
    def seq_tokens(self) -> np.ndarray:
        """int64 [n_seq]: real (non-padding) tokens per sequence."""
        cum = np.concatenate([[0], np.cumsum(self.segments[:, 3])])
        return cum[self.seg_offsets[1:]] - cum[self.seg_offsets[:-1]]


def pack_plan(db_path: Path, seq_len: int, global_batch: int, cost: tuple[float, float] = (1.0, 0.0)) -> Packing:
    """Pack ``plan_units`` from the build's DuckDB file; deterministic for the same plan."""
    with duckdb.connect(str(db_path), read_only=True) as con:
        sources = tuple(r[0] for r in con.sql("SELECT DISTINCT source FROM plan_quotas ORDER BY 1").fetchall())
        steps = con.sql("SELECT step, any_value(phase) FROM plan_quotas GROUP BY 1 ORDER BY 1").fetchall()
        rows = con.sql(
            "SELECT length, source, doc_id, start, step, ord FROM plan_units ORDER BY step, source, ord"
        ).fetchnumpy()
    src_idx = {s: i for i, s in enumerate(sources)}
    src = np.array([src_idx[s] for s in rows["source"]], dtype=np.int64)
    cols = [rows["length"], src, rows["doc_id"], rows["start"], rows["step"], rows["ord"]]
    units = np.stack([np.asarray(c, dtype=np.int64).reshape(-1) for c in cols], axis=1)
    return pack_units(units, [(int(s), str(p)) for s, p in steps], sources, seq_len, global_batch, cost)


def pack_units(
    units: np.ndarray,
    steps: list[tuple[int, str]],
    sources: tuple[str, ...],
    seq_len: int,
    global_batch: int,
    cost: tuple[float, float] = (1.0, 0.0),
) -> Packing:
    """Pack ``units`` int64 [n, 6] = (length, source index, doc_id, start, step, ord), each length ≤ S.

    ``steps`` lists (step, phase) in order; every step gets exactly ``global_batch`` sequences.
    """
    if len(units) and int(units[:, 0].max()) > seq_len:
        raise ValueError(f"a unit of {int(units[:, 0].max())} tokens is longer than S={seq_len}")
    by_step: dict[int, list[Unit]] = {}
    order = np.lexsort((units[:, 5], units[:, 1], units[:, 4])) if len(units) else np.zeros(0, np.int64)
    for u in units[order].tolist():
        by_step.setdefault(u[4], []).append(tuple(u))  # type: ignore[arg-type]
    seq_step: list[int] = []
    seg_counts: list[int] = []
    segments: list[tuple[int, int, int, int]] = []
    dropped: list[tuple[int, int, int, int]] = []
    carry: list[Unit] = []
    for i, (step, phase) in enumerate(steps):
        last_of_phase = i + 1 == len(steps) or steps[i + 1][1] != phase
        nxt = [] if last_of_phase else by_step.setdefault(steps[i + 1][0], [])
        bins, carry = _pack_step(carry + by_step.get(step, []), nxt, seq_len, global_batch, cost)
        for b in bins:
            seq_step.append(step)
            seg_counts.append(len(b))
            segments.extend((u[1], u[2], u[3], u[0]) for u in b)
        if last_of_phase:
            dropped.extend((u[1], u[2], u[3], u[0]) for u in carry)
            carry = []
    return Packing(
        sources=sources,
        seq_len=seq_len,
        seq_step=np.asarray(seq_step, dtype=np.int64),
        seg_offsets=np.concatenate([[0], np.cumsum(seg_counts, dtype=np.int64)]).astype(np.int64),
        segments=np.asarray(segments, dtype=np.int64).reshape(-1, 4),
        dropped=np.asarray(dropped, dtype=np.int64).reshape(-1, 4),
        cost=(float(cost[0]), float(cost[1])),
    )


class _Bins:
    """``n`` bins of ``seq_len`` slots; ``slots`` is sorted by (free, cost, bin) for best-fit bisects."""

    def __init__(self, n: int, seq_len: int, cost: tuple[float, float]) -> None:
        self.slots: list[tuple[int, float, int]] = [(seq_len, 0.0, b) for b in range(n)]
        self.items: list[list[Unit]] = [[] for _ in range(n)]
        self.att, self.lin = cost

    def place(self, u: Unit) -> bool:
        """Put ``u`` into the tightest bin that holds it (lowest cost among equal fits); False if none."""
        k = bisect.bisect_left(self.slots, (u[0], -1.0, -1))
        if k == len(self.slots):
            return False
        free, c, b = self.slots.pop(k)
        self.items[b].append(u)
        bisect.insort(self.slots, (free - u[0], c + self.att * u[0] * u[0] + self.lin * u[0], b))
        return True

    @property
    def max_free(self) -> int:
        return self.slots[-1][0] if self.slots else 0


def _pack_step(
    units: list[Unit], nxt: list[Unit], seq_len: int, n_bins: int, cost: tuple[float, float]
) -> tuple[list[list[Unit]], list[Unit]]:
    """Best-fit decreasing of ``units`` into ``n_bins``; fill gaps from ``nxt`` (mutated: placed removed).

    Returns the bins (each in placement order) and the units that did not fit, in plan order.
    """
    bins = _Bins(n_bins, seq_len, cost)
    left = [u for u in sorted(units, key=lambda u: (-u[0], u[4], u[1], u[5])) if not bins.place(u)]
    if nxt and bins.max_free > 0:
        keep = []
        for u in sorted(nxt, key=lambda u: (-u[0], u[1], u[5])):
            if u[0] > bins.max_free or not bins.place(u):
                keep.append(u)
        nxt[:] = sorted(keep, key=lambda u: (u[1], u[5]))
    left.sort(key=lambda u: (u[4], u[1], u[5]))
    return bins.items, left
