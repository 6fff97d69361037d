"""The plan's units as the packer reads them: blocks of whole steps from ``plan_units`` in DuckDB, and each
step's units grouped and sorted.

:func:`step_ranges` cuts the plan's steps into blocks of about a given number of units; :func:`prefetched`
reads each block (:func:`read_block`, in Arrow batches) on a helper thread while the packer packs the one before;
:func:`by_step` hands out each step's units sorted by (source, ord, doc_id, start), the order the packer's ties
are broken in. Units are int64 rows (length, source index, doc_id, start, step, ord).
"""

from __future__ import annotations

from collections.abc import Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

import duckdb
import numpy as np

__all__ = ["by_step", "prefetched", "read_block", "rows_of", "step_ranges"]


def by_step(blocks: Iterable[np.ndarray], step_values: np.ndarray, seq_len: int) -> Iterator[tuple[int, np.ndarray]]:
    """(row, that step's units sorted by (source, ord, doc_id, start)) from blocks of whole steps, sorted
    or not inside a block (sorted ones skip the sort); the blocks' step ranges increase and do not overlap."""
    for u in blocks:
        if not len(u):
            continue
        if int(u[:, 0].max()) > seq_len:
            raise ValueError(f"a unit of {int(u[:, 0].max())} tokens is longer than S={seq_len}")
        rows = rows_of(step_values, u[:, 4])
        keys = (rows, u[:, 1], u[:, 5], u[:, 2], u[:, 3])
        if not _is_sorted(keys):
            order = np.lexsort(keys[::-1])
            u, rows = u[order], rows[order]
        cut = np.flatnonzero(rows[1:] != rows[:-1]) + 1
        for part, r in zip(np.split(u, cut), rows[np.concatenate([[0], cut])].tolist(), strict=True):
            yield r, part


def _is_sorted(keys: tuple[np.ndarray, ...]) -> bool:
    """Whether rows are in lexicographic order of ``keys`` (most significant first)."""
    later = np.zeros(len(keys[0]) - 1, np.bool_)  # pairs already ordered by a more significant key
    for key in keys:
        a, b = key[:-1], key[1:]
        if ((a > b) & ~later).any():
            return False
        later |= a < b
    return True


def rows_of(step_values: np.ndarray, step: np.ndarray) -> np.ndarray:
    """int64 [n]: each of ``step``'s row in ``step_values`` (sorted); ValueError naming a step not there."""
    if len(step_values) and step_values[0] == 0 and step_values[-1] == len(step_values) - 1:
        rows = step.copy()  # steps 0..n-1, the plan's: a step is its row
    else:
        rows = np.searchsorted(step_values, step)
    bad = (rows < 0) | (rows >= len(step_values))
    bad[~bad] = step_values[rows[~bad]] != step[~bad]
    if len(step) and bad.any():
        raise ValueError(f"a unit is planned at step {int(step[bad][0])}, which is not in the plan's steps")
    return rows


def step_ranges(step_values: np.ndarray, counts: np.ndarray, chunk_units: int) -> list[tuple[int, int, int]]:
    """Consecutive (first step, last step, units) ranges covering ``step_values`` (sorted), each of about
    ``chunk_units`` units by ``counts`` (units per step), at least one step each."""
    ranges, lo, held = [], 0, 0
    for i, c in enumerate(counts.tolist()):
        held += c
        if held >= chunk_units or i + 1 == len(counts):
            ranges.append((int(step_values[lo]), int(step_values[i]), held))
            lo, held = i + 1, 0
    return ranges


def prefetched(
    con: duckdb.DuckDBPyConnection, sources: tuple[str, ...], ranges: list[tuple[int, int, int]]
) -> Generator[np.ndarray, None, None]:
    """The blocks of ``ranges`` in order, each read by a helper thread (on a cursor of ``con``) while the
    caller packs the one before: DuckDB and the compiled kernel both run without the GIL. Holds at most two
    blocks."""
    with con.cursor() as cur, ThreadPoolExecutor(1, thread_name_prefix="weir-pack-read") as pool:
        ahead = pool.submit(read_block, cur, sources, *ranges[0]) if ranges else None
        for k in range(len(ranges)):
            assert ahead is not None
            block = ahead.result()
            ahead = pool.submit(read_block, cur, sources, *ranges[k + 1]) if k + 1 < len(ranges) else None
            yield block


def read_block(con: duckdb.DuckDBPyConnection, sources: tuple[str, ...], lo: int, hi: int, n: int) -> np.ndarray:
    """The ``n`` rows of ``plan_units`` of steps ``lo..hi`` as int64 [n, 6] (length, source index, doc_id,
    start, step, ord), sorted by (step, source, ord, doc_id, start), fetched in Arrow batches."""
    rel = con.sql(
        "SELECT length, list_position($names, source) - 1 AS src, doc_id, start, step, ord FROM plan_units "
        "WHERE step BETWEEN $lo AND $hi ORDER BY step, src, ord, doc_id, start",
        params={"names": list(sources), "lo": lo, "hi": hi},
    )
    out, at = np.empty((n, 6), np.int64), 0
    for batch in rel.to_arrow_reader(1 << 16):
        if batch.column(1).null_count:
            raise ValueError("plan_units has a source that plan_quotas lacks")
        if at + batch.num_rows > len(out):  # more rows than counted: grow (never, for a read-only file)
            out = np.concatenate([out, np.empty((at + batch.num_rows - len(out), 6), np.int64)])
        for c in range(6):
            out[at : at + batch.num_rows, c] = batch.column(c).to_numpy()
        at += batch.num_rows
    return out[:at]
