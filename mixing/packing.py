"""Packing a plan's units into fixed-length sequences, step by step, never across a phase boundary.

Each step has ``global_batch`` sequences of ``S`` token slots. Units (whole documents, or S-sized pieces
of longer ones) are placed first-fit decreasing; a unit that does not fit is carried into the next step of
the same phase, and gaps left at a step are filled with the next step's units that fit, so the carry
never grows. Units still carried at the end of a phase are dropped and reported per source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

__all__ = ["Packing", "pack_plan"]

# A unit: (length, source index, doc_id, start, planned step, ord). Tuples keep the hot loop cheap.
Unit = tuple[int, int, int, int, int, int]


@dataclass(frozen=True)
class Packing:
    """Sequences in step order.

    ``seq_step`` int64 [n_seq]; ``seg_offsets`` int64 [n_seq+1] into ``segments``; ``segments`` int64
    [n_seg, 4] = (source index, doc_id, start, length) in placement order inside each sequence.
    ``dropped`` int64 [n_drop, 4] in the same layout. ``sources`` names the source indices.
    """

    sources: tuple[str, ...]
    seq_len: int
    seq_step: np.ndarray
    seg_offsets: np.ndarray
    segments: np.ndarray
    dropped: np.ndarray


def pack_plan(db_path: Path, seq_len: int, global_batch: int) -> Packing:
    """Pack ``plan_units`` from the build's DuckDB file; deterministic for the same plan."""
    with duckdb.connect(str(db_path), read_only=True) as con:
        sources = tuple(r[0] for r in con.sql("SELECT DISTINCT source FROM plan_quotas ORDER BY 1").fetchall())
        steps = con.sql("SELECT step, any_value(phase) FROM plan_quotas GROUP BY 1 ORDER BY 1").fetchall()
        rows = con.sql(
            "SELECT length, source, doc_id, start, step, ord FROM plan_units ORDER BY step, source, ord"
        ).fetchnumpy()
    src_idx = {s: i for i, s in enumerate(sources)}
    by_step: dict[int, list[Unit]] = {}
    for length, src, doc, start, step, ord_ in zip(
        rows["length"], rows["source"], rows["doc_id"], rows["start"], rows["step"], rows["ord"], strict=True
    ):
        by_step.setdefault(int(step), []).append(
            (int(length), src_idx[src], int(doc), int(start), int(step), int(ord_))
        )

    seq_step: list[int] = []
    seg_counts: list[int] = []
    segments: list[tuple[int, int, int, int]] = []
    dropped: list[tuple[int, int, int, int]] = []
    carry: list[Unit] = []
    for i, (step, phase) in enumerate(steps):
        last_of_phase = i + 1 == len(steps) or steps[i + 1][1] != phase
        nxt = [] if last_of_phase else by_step.setdefault(steps[i + 1][0], [])
        bins, carry = _pack_step(carry + by_step.get(step, []), nxt, seq_len, global_batch)
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
    )


def _pack_step(units: list[Unit], nxt: list[Unit], seq_len: int, n_bins: int) -> tuple[list[list[Unit]], list[Unit]]:
    """First-fit decreasing of ``units`` into ``n_bins``; fill gaps from ``nxt`` (mutated: placed removed).

    Returns the bins (each in placement order) and the units that did not fit.
    """
    free = [seq_len] * n_bins
    bins: list[list[Unit]] = [[] for _ in range(n_bins)]
    left: list[Unit] = []
    for u in sorted(units, key=lambda u: (-u[0], u[4], u[1], u[5])):
        for b in range(n_bins):
            if free[b] >= u[0]:
                free[b] -= u[0]
                bins[b].append(u)
                break
        else:
            left.append(u)
    if nxt and max(free) > 0:
        keep: list[Unit] = []
        for u in sorted(nxt, key=lambda u: (-u[0], u[1], u[5])):
            fits = [b for b in range(n_bins) if free[b] >= u[0]]
            if fits:
                b = min(fits, key=free.__getitem__)  # best fit keeps large gaps for large units
                free[b] -= u[0]
                bins[b].append(u)
            else:
                keep.append(u)
        nxt[:] = sorted(keep, key=lambda u: (u[1], u[5]))
    left.sort(key=lambda u: (u[4], u[1], u[5]))
    return bins, left
