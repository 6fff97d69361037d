"""The reference packer, a test oracle: weir's first packer, the whole plan in one Python loop.

Its cost of a unit is the shared :class:`~contract.cost.CostModel`'s; its pool and bins are the ``"python"``
engine's (:mod:`mixing.pack.python_pool`), its loop over steps is the first one written, and what a phase end
drops is :func:`mixing.pack.phase_end.drop_mask`'s choice (dry runs on the ``"python"`` engine's pool).

:mod:`mixing.pack.packing` packs with the same algorithm, streamed; ``tests/mixing/pack/test_packing_scale.py``
holds every engine to this packer, which must give the same packing for the same plan, and
``benchmarks/packing.py`` measures weir's packer beside it. Its ``pack_plan`` fetches every unit into Python
tuples at once (about 575 bytes per unit at its peak): never a build's packer.

The algorithm (mixture-steered best-fit decreasing, carry within a phase, drops at phase ends) is described
once, in :mod:`mixing.pack.packing`'s docstring; this module is its first implementation. Cost:
O(n log n + n·(k + log B)) per step for n units in the pool, k sources and B bins (bisects over sorted
lists); deterministic for the same plan (ties broken by length, due tokens, source, step, draw order, then
bin index). ``fair_drops=False`` packs without the phase end's choice, as
:func:`mixing.pack.packing.pack_units` does then.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np

from contract.cost import CostModel
from mixing.pack.phase_end import drop_mask, due
from mixing.pack.python_pool import Bins, PythonPool, Unit, UnitPool
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
    seq_step: list[int] = []
    seg_counts: list[int] = []
    segments: list[tuple[int, int, int, int]] = []
    dropped: list[tuple[int, int, int, int]] = []
    pool = UnitPool(n_src)
    aside: list[Unit] = []
    q_cum = np.zeros(n_src)
    r_cum = np.zeros(n_src)
    first = 0
    for i, (step, phase) in enumerate(steps):
        if i == 0 or steps[i - 1][1] != phase:  # a phase starts: its own pool and its own shares
            q_cum[:], r_cum[:] = 0.0, 0.0
            first = i
            pool.add(by_step.get(i, []))
        last_of_phase = i + 1 == len(steps) or steps[i + 1][1] != phase
        if not last_of_phase:
            pool.add(by_step.get(i + 1, []))  # lookahead: the next step's units may fill gaps
        q_cum += quotas[i]
        left = 1 if last_of_phase else 2 if i + 2 == len(steps) or steps[i + 2][1] != phase else 0
        if fair_drops and left and (left == 2 or i == first):  # the pool holds all the phase has left
            held = sorted(pool.drain(), key=lambda u: (u[1], u[3], u[2], u[4], u[5]))
            rows = np.array([(u[0], u[3], u[4], u[5], u[1], u[2]) for u in held], np.int64).reshape(-1, 6)
            mask = drop_mask(
                rows,
                lambda: PythonPool(n_src, seq_len, cost),
                q_cum,
                r_cum,
                quotas[i + 1 : i + left],
                cap,
                global_batch,
                step,
                i + left - first,
            ).tolist()
            pool.add([u for u, m in zip(held, mask, strict=True) if not m])
            aside = [u for u, m in zip(held, mask, strict=True) if m]
        bins = Bins(global_batch, seq_len, cost)
        r_cum += pool.fill(bins, due(q_cum, r_cum, cap).tolist())
        for b in bins.items:
            seq_step.append(step)
            seg_counts.append(len(b))
            segments.extend((u[3], u[4], u[5], u[0]) for u in b)
        if last_of_phase:  # per source: what was set aside, then what the last fill left, each in plan order
            rest = sorted(pool.drain(), key=lambda u: (u[3], u[1], u[2]))
            aside.sort(key=lambda u: (u[3], u[1], u[2], u[4], u[5]))
            for s in range(n_src):
                dropped.extend((u[3], u[4], u[5], u[0]) for part in (aside, rest) for u in part if u[3] == s)
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
