"""The reference packer, a test oracle: weir's packer as one Python loop over the whole plan.

Its cost of a unit is the shared :class:`~contract.cost.CostModel`'s; its pool and bins are the ``"python"``
engine's (:mod:`mixing.pack.python_pool`), its rules against a length bias (ageing, the phase end's seeded
choice) :mod:`mixing.pack.phase_end`'s, and its loop over steps is written here on its own.

:mod:`mixing.pack.packing` packs with the same algorithm, streamed; ``tests/mixing/pack/test_packing_scale.py``
holds every engine to this packer, which must give the same packing for the same plan, and
``benchmarks/packing.py`` measures weir's packer beside it. Its ``pack_plan`` fetches every unit into Python
tuples at once (about 575 bytes per unit at its peak): never a build's packer.

The algorithm (mixture-steered best-fit decreasing, carry within a phase, urgent units first, drops at phase
ends chosen by a seeded priority) is described once, in :mod:`mixing.pack.packing`'s docstring. Cost:
O(n log n + n·(k + log B)) per step for n units in the pool, k sources and B bins (bisects over sorted
lists); deterministic for the same plan (ties broken by length, due tokens, source, step, draw order, then
bin index). ``fair_drops=False`` packs without ageing and without the phase end's choice, as
:func:`mixing.pack.packing.pack_units` does then.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np

from contract.cost import CostModel
from mixing.pack.phase_end import AGE_STEPS, OVERSHOOT, drop_targets, set_aside
from mixing.pack.python_pool import Bins, Unit, UnitPool
from mixing.pack.result import Packing

__all__ = ["pack_plan", "pack_units"]


def pack_plan(
    db_path: Path, seq_len: int, global_batch: int, cost: CostModel = CostModel(), *, fair_drops: bool = True
) -> Packing:
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
    return pack_units(units, step_list, sources, seq_len, global_batch, cost, quotas=quotas, fair_drops=fair_drops)


def pack_units(
    units: np.ndarray,
    steps: list[tuple[int, str]],
    sources: tuple[str, ...],
    seq_len: int,
    global_batch: int,
    cost: CostModel = CostModel(),
    quotas: np.ndarray | None = None,
    *,
    fair_drops: bool = True,
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
    bounds: list[tuple[int, int]] = []  # per row: its phase's first and last rows (a phase: a run of one name)
    for i, (_s, phase) in enumerate(steps):
        bounds.append((i if i == 0 or steps[i - 1][1] != phase else bounds[-1][0], i))
    for i in range(len(steps) - 2, -1, -1):
        if steps[i + 1][1] == steps[i][1]:
            bounds[i] = (bounds[i][0], bounds[i + 1][1])
    seq_step: list[int] = []
    seg_counts: list[int] = []
    segments: list[tuple[int, int, int, int]] = []
    dropped: list[tuple[int, int, int, int]] = []
    pool = UnitPool(n_src)
    aside: list[Unit] = []
    q_cum = np.zeros(n_src)
    r_cum = np.zeros(n_src)
    for i, (step, _phase) in enumerate(steps):
        first, last = bounds[i]
        if i == first:  # a phase starts: its own pool and its own shares
            q_cum[:], r_cum[:] = 0.0, 0.0
            pool.add(by_step.get(i, []))
        if i < last:
            pool.add(by_step.get(i + 1, []))  # lookahead: the next step's units may fill gaps
        q_cum += quotas[i]
        if fair_drops and i - AGE_STEPS - 1 >= first:
            pool.age(steps[i - AGE_STEPS - 1][0])
        if fair_drops and i == max(first, last - 1):  # the pool holds all the phase has left
            left = last - i + 1
            q_end = q_cum + quotas[i + 1] if i < last else q_cum
            held = pool.held()
            rows_held = np.array([(u[0], u[3], u[4], u[5], u[1], u[2]) for u in held], np.int64).reshape(-1, 6)
            tokens = np.bincount(rows_held[:, 1], weights=rows_held[:, 0], minlength=n_src)
            targets = drop_targets(tokens, _due(q_end, r_cum, left * cap), left * cap)
            mask = set_aside(rows_held, targets, OVERSHOOT * q_end.sum())
            pool.remove(mask.tolist())
            aside = [u for u, m in zip(held, mask.tolist(), strict=True) if m]
        bins = Bins(global_batch, seq_len, cost)
        r_cum += pool.fill(bins, _due(q_cum, r_cum, cap).tolist())
        for b in bins.items:
            seq_step.append(step)
            seg_counts.append(len(b))
            segments.extend((u[3], u[4], u[5], u[0]) for u in b)
        if i == last:
            left_over = sorted(aside + pool.drain(), key=lambda u: (u[3], u[1], u[2], u[0], u[4], u[5]))
            dropped.extend((u[3], u[4], u[5], u[0]) for u in left_over)
            aside = []
    return Packing(
        sources=sources,
        seq_len=seq_len,
        seq_step=np.asarray(seq_step, dtype=np.int64),
        seg_offsets=np.concatenate([[0], np.cumsum(seg_counts, dtype=np.int64)]).astype(np.int64),
        segments=np.asarray(segments, dtype=np.int64).reshape(-1, 4),
        dropped=np.asarray(dropped, dtype=np.int64).reshape(-1, 4),
        cost=cost,
    )


def _due(q_cum: np.ndarray, r_cum: np.ndarray, capacity: float) -> np.ndarray:
    total = q_cum.sum()
    if total <= 0:
        return np.full(len(q_cum), capacity / max(len(q_cum), 1))
    return q_cum * ((r_cum.sum() + capacity) / total) - r_cum  # type: ignore[no-any-return]
