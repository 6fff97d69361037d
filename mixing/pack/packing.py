"""Packing a plan's units into fixed-length sequences, step by step, never across a phase boundary.

Each step has ``global_batch`` sequences (bins) of ``S`` token slots. Units (whole documents, or the
S-sized pieces the plan cut from documents longer than S, and only those) are never split here:
``truncated_docs`` is 0 by construction.

The realized mixture tracks the plan's quotas (docs/design.md's ``mixture_error``). Within a phase the packer
keeps, per source, the cumulative quota ``Q_s`` and the cumulative tokens placed ``R_s``. A step is due
``want_s = Q_s·ρ − R_s`` tokens of source s, where ρ = (ΣR + step capacity) ÷ ΣQ, so that Σ want = the
step's capacity and a full step puts every source exactly on its share. The step is filled from a pool of
the phase's unplaced units (those carried from earlier steps, this step's, and the next step's) by
**best-fit decreasing, steered by the mixture**: the next unit is the longest one that fits some bin
among the sources still behind their due tokens (counting only units that bring their source closer to
it), and goes into the bin whose free space is the smallest that still holds it; among bins with that
same free space the one whose attention cost so far is the lowest wins, so the sequences' costs come out
more even for the sampler that later balances whole sequences across ranks. Only when no source behind
has such a unit does the longest unit that fits from any source fill the gap (padding does not grow; the
next steps' dues make up for it).

Units left in the pool are carried to the next step of the phase; those left at a phase end are dropped
and reported per source. Because every step is steered by the cumulative deficit, what one step could not
place is made up by the next, and what is dropped at a phase end is what the plan drew beyond the phase's
share of each source (and the padding). Which units those are is not left to the fills, which would leave
each source's shortest: when the pool first holds all its phase has left, :mod:`mixing.pack.phase_end`
dry-runs the phase's remaining fills and sets aside as many tokens per source by a seeded hash, the latest
planned first, kept only where the padding and the mixture stay as they were (within small bounds).

The packer streams: ``stream_plan`` reads ``plan_units`` from DuckDB a block of steps at a time (about
``chunk_units`` units, in Arrow batches; a helper thread reads the next block while the current one is packed:
:mod:`mixing.pack.units`), the pool holds only a phase's carry (what earlier steps of the phase could not place)
plus two steps of units, and each step's sequences are handed out as they are made (:class:`PackStream`). Its
memory is therefore bounded by the block size and the largest steps, not the plan. ``pack_plan`` collects the
stream into one :class:`Packing` (32 bytes per segment) for callers that want it whole; the build
(:mod:`mixing.pack.packed`) writes shards from the stream instead. The inner loop (:mod:`mixing.pack.pool`) is
compiled with numba where it is installed (about 20× the pure-Python reference packer,
``tests/mixing/pack/reference.py``, on ``benchmarks/packing.py``; see docs/scale-packing.md) and gives the same
packing, unit for unit, either way. Its results are :mod:`mixing.pack.result`'s types.

Deterministic for the same plan, whatever the engine and however the units are read (ties broken by
length, due tokens, source, step, draw order, then bin index; the drops by the units' hashes).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import duckdb
import numpy as np

from contract.cost import CostModel
from mixing.pack.phase_end import drop_mask, due
from mixing.pack.pool import default_engine, make_pool
from mixing.pack.result import PackedStep, Packing, PackStream
from mixing.pack.units import by_step, prefetched, rows_of, step_ranges

__all__ = ["pack_plan", "pack_units", "stream_plan"]

_CHUNK_UNITS = 1 << 18  # units read from DuckDB per block of steps (12 MB as int64 rows; two in flight)


def pack_plan(
    db_path: Path,
    seq_len: int,
    global_batch: int,
    cost: CostModel = CostModel(),
    *,
    engine: str | None = None,
    chunk_units: int = _CHUNK_UNITS,
    fair_drops: bool = True,
) -> Packing:
    """:func:`stream_plan` collected into one :class:`Packing` (32 bytes per segment, held whole)."""
    stream = stream_plan(
        db_path, seq_len, global_batch, cost, engine=engine, chunk_units=chunk_units, fair_drops=fair_drops
    )
    return _collect(stream)


def stream_plan(
    db_path: Path,
    seq_len: int,
    global_batch: int,
    cost: CostModel = CostModel(),
    *,
    engine: str | None = None,
    chunk_units: int = _CHUNK_UNITS,
    config: Mapping[str, str | int | bool] | None = None,
    sources: Sequence[str] | None = None,
    fair_drops: bool = True,
) -> PackStream:
    """Pack ``plan_units`` against ``plan_quotas`` from the build's DuckDB file, a step at a time as the
    stream is read; deterministic for the same plan.

    Reads ``plan_quotas(step, phase, source, quota)`` whole now (steps × sources rows), and ``plan_units(step,
    source, doc_id, start, length, ord)`` as ``steps`` is iterated: a block of about ``chunk_units`` units at
    a time, by step range, in Arrow batches, on a connection of its own that closes when the stream ends or is
    closed. ``engine``: ``"compiled"`` or ``"python"`` (default: compiled where numba is installed).
    ``config``: DuckDB settings of both connections (``memory_limit``: the pages it reads stay in DuckDB's
    buffer pool up to its limit, 80% of the RAM by default). ``sources``: the order of the source indices in
    the stream's segments (default: the plan's sources by name; a continuation keeps its base's order and
    appends, and may name sources the plan has none of). ``fair_drops``: what a phase end drops chosen by a
    seeded hash (:mod:`mixing.pack.phase_end`); False drops what the phase's last fill left, its shortest units
    (``benchmarks/packing.py`` compares the two).
    """
    settings: dict[str, str | bool | int | float | list[str]] = dict(config or {})
    with duckdb.connect(str(db_path), read_only=True, config=settings) as con:
        q = con.sql("SELECT step, phase, source, quota FROM plan_quotas ORDER BY step, source").fetchnumpy()
        per_step = con.sql("SELECT step, count(*) AS n FROM plan_units GROUP BY 1 ORDER BY 1").fetchnumpy()
    planned = sorted(set(q["source"].tolist()))
    if sources is not None and not set(planned) <= set(sources):
        raise ValueError(f"the plan's sources {planned} are not all in the order given, {list(sources)}")
    names: tuple[str, ...] = tuple(sources) if sources is not None else tuple(planned)
    q_step = np.asarray(q["step"], np.int64)
    step_values, first = np.unique(q_step, return_index=True)
    steps = [(int(s), str(q["phase"][i])) for s, i in zip(step_values.tolist(), first.tolist(), strict=True)]
    src_idx = {s: i for i, s in enumerate(names)}
    quotas = np.zeros((len(steps), len(names)), dtype=np.float64)
    quotas[np.searchsorted(step_values, q_step), [src_idx[s] for s in q["source"]]] = q["quota"]
    unit_steps = np.asarray(per_step["step"], np.int64)
    if not np.isin(unit_steps, step_values).all():
        lost = unit_steps[~np.isin(unit_steps, step_values)]
        raise ValueError(f"{db_path}: plan_units has units at step {int(lost[0])}, which plan_quotas lacks")
    counts = np.zeros(len(steps), np.int64)  # units per step, to cut blocks of about chunk_units
    counts[np.searchsorted(step_values, unit_steps)] = per_step["n"]
    ranges = step_ranges(step_values, counts, chunk_units)

    def packed() -> Iterator[PackedStep]:
        with duckdb.connect(str(db_path), read_only=True, config=settings) as con:
            blocks = prefetched(con, names, ranges)
            try:
                units = by_step(blocks, step_values, seq_len)
                yield from _steps(units, steps, len(names), seq_len, global_batch, cost, quotas, engine, fair_drops)
            finally:
                blocks.close()  # on an error: wait for a read in flight before the connection closes

    n_units = int(np.asarray(per_step["n"], np.int64).sum())
    return PackStream(names, seq_len, global_batch, cost, len(steps) * global_batch, n_units, packed())


def pack_units(
    units: np.ndarray,
    steps: list[tuple[int, str]],
    sources: tuple[str, ...],
    seq_len: int,
    global_batch: int,
    cost: CostModel = CostModel(),
    quotas: np.ndarray | None = None,
    *,
    engine: str | None = None,
    fair_drops: bool = True,
) -> Packing:
    """Pack ``units`` int64 [n, 6] = (length, source index, doc_id, start, step, ord), each length ≤ S.

    ``steps`` lists (step, phase) in order; every step gets exactly ``global_batch`` sequences.
    ``quotas`` [len(steps), len(sources)]: planned tokens per step (row i is ``steps[i]``) and source, the
    shares the realized mixture tracks; by default the units' own lengths per planned step. The order of
    ``units`` does not matter. ``engine``, ``fair_drops``: as :func:`stream_plan`'s.
    """
    units = np.asarray(units, dtype=np.int64).reshape(-1, 6)
    step_values = np.array([s for s, _p in steps], dtype=np.int64)
    if quotas is None:
        quotas = np.zeros((len(steps), len(sources)))
        if len(units):
            np.add.at(quotas, (rows_of(step_values, units[:, 4]), units[:, 1]), units[:, 0])
    units_by_step = by_step([units], step_values, seq_len)
    packed = _steps(units_by_step, steps, len(sources), seq_len, global_batch, cost, quotas, engine, fair_drops)
    return _collect(PackStream(sources, seq_len, global_batch, cost, len(steps) * global_batch, len(units), packed))


def _collect(stream: PackStream) -> Packing:
    """Every step of ``stream`` in one :class:`Packing` (room for ``stream.units`` segments allocated once)."""
    counts = np.zeros(stream.sequences, np.int64)
    segments = np.zeros((stream.units, 4), np.int64)
    n_seg = 0
    seq_step: list[np.ndarray] = []
    dropped: list[np.ndarray] = []
    for i, out in enumerate(stream.steps):
        m = len(out.segments)
        if len(segments) < n_seg + m:  # more units than announced: double the room
            room = max(n_seg + m, 2 * len(segments)) - len(segments)
            segments = np.concatenate([segments, np.zeros((room, 4), np.int64)])
        segments[n_seg : n_seg + m] = out.segments
        n_seg += m
        counts[i * stream.global_batch : (i + 1) * stream.global_batch] = out.counts
        seq_step.append(np.full(stream.global_batch, out.step, np.int64))
        if len(out.dropped):
            dropped.append(out.dropped)
    return Packing(
        sources=stream.sources,
        seq_len=stream.seq_len,
        seq_step=np.concatenate(seq_step) if seq_step else np.zeros(0, np.int64),
        seg_offsets=np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64),
        segments=segments[:n_seg],  # a view: the room left is what was dropped
        dropped=np.concatenate(dropped).astype(np.int64).reshape(-1, 4) if dropped else np.zeros((0, 4), np.int64),
        cost=stream.cost,
    )


def _steps(
    step_units: Iterator[tuple[int, np.ndarray]],
    steps: list[tuple[int, str]],
    n_src: int,
    seq_len: int,
    global_batch: int,
    cost: CostModel,
    quotas: np.ndarray,
    engine: str | None,
    fair_drops: bool = True,
) -> Iterator[PackedStep]:
    """The step loop: ``step_units`` yields (row in ``steps``, that step's units) in increasing row order,
    each step's units sorted by (source, ord, doc_id, start); steps without units may be skipped. Yields
    every step of ``steps`` in order; holds the pool and the blocks being read, nothing of earlier steps."""
    quotas = np.asarray(quotas, dtype=np.float64).reshape(len(steps), n_src)
    cap = float(seq_len * global_batch)
    name = engine or default_engine()
    pool = make_pool(name, n_src, seq_len, cost)
    pending = _Lookahead(step_units)
    q_cum = np.zeros(n_src)
    r_cum = np.zeros(n_src)
    first = 0  # the phase's first row
    aside = np.zeros((0, 6), np.int64)  # what the phase end drops, set aside when the pool held all that was left
    for i, (step, phase) in enumerate(steps):
        if i == 0 or steps[i - 1][1] != phase:  # a phase starts: its own pool and its own shares
            q_cum[:], r_cum[:] = 0.0, 0.0
            first = i
            pool.add(pending.take(i))
        last_of_phase = i + 1 == len(steps) or steps[i + 1][1] != phase
        if not last_of_phase:
            pool.add(pending.take(i + 1))  # lookahead: the next step's units may fill gaps
        q_cum += quotas[i]
        ends_next = not last_of_phase and (i + 2 == len(steps) or steps[i + 2][1] != phase)
        if fair_drops and (ends_next or (last_of_phase and i == first)):  # the pool holds all the phase has left
            rows = pool.take_all()
            later = quotas[i + 1 : i + 2] if ends_next else quotas[:0]
            mask = drop_mask(
                rows,
                lambda: make_pool(name, n_src, seq_len, cost),
                q_cum,
                r_cum,
                later,
                cap,
                global_batch,
                step,
                i + len(later) + 1 - first,
            )
            aside = rows[mask]
            pool.add(rows[~mask])
        segs = np.zeros((len(pool), 4), np.int64)
        counts = np.zeros(global_batch, np.int64)
        n, placed = pool.fill(due(q_cum, r_cum, cap), segs, counts)
        r_cum += placed
        drop = np.zeros((0, 4), np.int64)
        if last_of_phase:
            drop = pool.drain().astype(np.int64).reshape(-1, 4)
            if len(aside):
                drop = _segments(np.concatenate([aside[:, [1, 2, 3, 0]], drop]))
                aside = aside[:0]
        yield PackedStep(step, counts, segs[:n].copy(), drop)
    pending.finish()


def _segments(segs: np.ndarray) -> np.ndarray:
    """Segments (source, doc_id, start, length) in a drain's order: by source, then as given (stable)."""
    return segs[np.argsort(segs[:, 0], kind="stable")]


class _Lookahead:
    """Hands out each step's units by row, pulling blocks from the iterator only as far as needed."""

    def __init__(self, step_units: Iterator[tuple[int, np.ndarray]]) -> None:
        self.it, self.held = step_units, dict[int, np.ndarray]()
        self.seen = -1

    def take(self, row: int) -> np.ndarray:
        while self.seen < row:
            nxt = next(self.it, None)
            if nxt is None:
                self.seen = 1 << 62
                break
            self.seen = nxt[0]
            self.held[nxt[0]] = nxt[1]
        return self.held.pop(row, np.zeros((0, 6), np.int64))

    def finish(self) -> None:
        """Exhaust the iterator (so that a unit planned at an unknown step raises)."""
        for _ in self.it:
            pass
