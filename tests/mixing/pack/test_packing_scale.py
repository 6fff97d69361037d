"""The streamed packer (every engine) against the reference packer, on random plans, with and without its rules
against a length bias (``fair_drops``).

Same packing unit for unit (hence the same packing_efficiency, truncated_docs, tokens dropped and
mixture_error), the packing invariants, reading DuckDB in blocks of any size, and bounded memory.
"""

from __future__ import annotations

import importlib.util
import tracemalloc
from collections import Counter
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.cost import CostModel
from mixing.pack.packing import pack_plan, pack_units, stream_plan
from mixing.pack.result import Packing
from mixing.plan.mixture import mixture_error
from tests.mixing.pack import reference as v1

ENGINES = [
    "python",
    "interpreted",  # the compiled engine's kernels, run by the interpreter: checked even without numba
    pytest.param(
        "compiled",
        marks=pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba is not installed"),
    ),
]
FIELDS = ("seq_step", "seg_offsets", "segments", "dropped")


def random_plan(
    seed: int, n_steps: int, batch: int, seq_len: int, n_src: int, overdraw: float
) -> tuple[np.ndarray, list[tuple[int, str]], np.ndarray]:
    """(units int64 [n, 6] = (length, source, doc_id, start, step, ord), (step, phase) list, quotas).

    Long-tailed document lengths, documents longer than S cut into S pieces (pieces of one document may
    land in different steps, as the plan's do), one to three phases, per-phase shares, each step drawing
    about ``overdraw`` × its capacity."""
    rng = np.random.default_rng(seed)
    cuts = sorted(rng.choice(np.arange(1, n_steps), size=min(n_steps - 1, int(rng.integers(0, 3))), replace=False))
    phase_of = np.searchsorted(np.array(cuts, dtype=np.int64), np.arange(n_steps), side="right")
    steps = [(s, f"p{int(phase_of[s])}") for s in range(n_steps)]
    shares = rng.dirichlet(np.ones(n_src), size=int(phase_of.max()) + 1)
    cap = seq_len * batch
    quotas = np.floor(shares[phase_of] * cap)
    rows: list[tuple[int, int, int, int, int, int]] = []
    next_doc = [0] * n_src
    ords = [0] * n_src
    for step in range(n_steps):
        for s in range(n_src):
            left = quotas[step, s] * overdraw
            while left > 0:
                n = int(min(rng.lognormal(np.log(seq_len) - 2.0, 1.4) + 1, 4 * seq_len))
                doc = next_doc[s]
                next_doc[s] += 1
                for start in range(0, n, seq_len):
                    length = min(seq_len, n - start)
                    at = min(n_steps - 1, step + int(rng.integers(0, 2))) if start else step
                    rows.append((length, s, doc, start, at, ords[s]))
                    ords[s] += 1
                    left -= length
    return np.array(rows, dtype=np.int64).reshape(-1, 6), steps, quotas


def figures(p: Packing, units: np.ndarray, steps: list[tuple[int, str]], quotas: np.ndarray) -> dict[str, float]:
    """packing_efficiency, truncated_docs (units split: 0 by construction), tokens dropped, mixture_error."""
    n_src = quotas.shape[1]
    realized = np.zeros_like(quotas)
    np.add.at(realized, (np.repeat(p.seq_step, np.diff(p.seg_offsets)), p.segments[:, 0]), p.segments[:, 3])
    names = list(dict.fromkeys(ph for _s, ph in steps))
    phase = np.array([names.index(ph) for _s, ph in steps])
    me = mixture_error(realized, quotas, phase, [f"s{k}" for k in range(n_src)], names)
    planned = Counter(map(tuple, units[:, [1, 2, 3, 0]].tolist()))
    return {
        "packing_efficiency": float(p.seq_tokens.sum() / (len(p.seq_step) * p.seq_len)),
        "units_split": sum(1 for r in map(tuple, p.segments.tolist()) if r not in planned),
        "tokens_dropped": int(p.dropped[:, 3].sum()),
        "window": me.window,
        "phase": me.phase,
    }


def write_plan(path: Path, units: np.ndarray, steps: list[tuple[int, str]], quotas: np.ndarray) -> None:
    """A DuckDB file with the ``plan_units`` and ``plan_quotas`` columns the packer reads."""
    names = np.array([f"s{k}" for k in range(quotas.shape[1])])
    phase = np.array([ph for _s, ph in steps])
    step = np.array([s for s, _p in steps], dtype=np.int64)
    k = quotas.shape[1]
    q = pa.table(
        {
            "step": np.repeat(step, k),
            "phase": np.repeat(phase, k),
            "source": np.tile(names, len(step)),
            "quota": quotas.reshape(-1).astype(np.int64),
        }
    )
    u = pa.table(
        {
            "step": units[:, 4],
            "phase": phase[units[:, 4]],
            "source": names[units[:, 1]],
            "doc_id": units[:, 2],
            "start": units[:, 3],
            "length": units[:, 0],
            "ord": units[:, 5],
        }
    )
    with duckdb.connect(str(path)) as con:
        con.register("q", q)
        con.register("u", u)
        con.execute("CREATE TABLE plan_quotas AS SELECT * FROM q")
        con.execute("CREATE TABLE plan_units AS SELECT * FROM u ORDER BY step, source, ord")


plans = st.tuples(
    st.integers(0, 2**32 - 1),  # seed
    st.integers(1, 9),  # steps
    st.integers(1, 6),  # global batch
    st.sampled_from([16, 100, 512, 1000]),  # S
    st.integers(1, 4),  # sources
    st.sampled_from([0.7, 1.0, 1.05, 1.3]),  # plan draws this × each step's capacity
    st.sampled_from([CostModel(1.0, 0.0), CostModel(1.0, 64.0), CostModel(0.0, 1.0)]),  # cost
    st.booleans(),  # fair_drops
)


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(plans)
def test_same_packing_and_figures_as_the_reference(engine: str, plan: tuple) -> None:  # type: ignore[type-arg]
    seed, n_steps, batch, seq_len, n_src, overdraw, cost, fair = plan
    units, steps, quotas = random_plan(seed, n_steps, batch, seq_len, n_src, overdraw)
    sources = tuple(f"s{k}" for k in range(n_src))
    ref = v1.pack_units(units, steps, sources, seq_len, batch, cost, quotas=quotas, fair_drops=fair)
    new = pack_units(units, steps, sources, seq_len, batch, cost, quotas=quotas, engine=engine, fair_drops=fair)
    assert figures(new, units, steps, quotas) == figures(ref, units, steps, quotas)
    for f in FIELDS:
        assert np.array_equal(getattr(new, f), getattr(ref, f)), f
    assert np.array_equal(new.seq_cost, ref.seq_cost)


@pytest.mark.parametrize("engine", ENGINES)
@settings(max_examples=40)
@given(plans)
def test_packing_invariants(engine: str, plan: tuple) -> None:  # type: ignore[type-arg]
    seed, n_steps, batch, seq_len, n_src, overdraw, cost, fair = plan
    units, steps, quotas = random_plan(seed, n_steps, batch, seq_len, n_src, overdraw)
    sources = tuple(f"s{k}" for k in range(n_src))
    p = pack_units(units, steps, sources, seq_len, batch, cost, quotas=quotas, engine=engine, fair_drops=fair)
    # every planned unit packed once, whole, or reported dropped: tokens conserved, no document ≤ S split
    planned = Counter(map(tuple, units[:, [1, 2, 3, 0]].tolist()))
    assert Counter(map(tuple, np.concatenate([p.segments, p.dropped]).tolist())) == planned
    assert int(p.segments[:, 3].sum() + p.dropped[:, 3].sum()) == int(units[:, 0].sum())
    assert (p.seq_tokens <= seq_len).all()
    assert np.array_equal(p.seq_step, np.repeat(np.arange(n_steps), batch))  # each step: exactly B sequences
    # never across a phase boundary: a unit lands in a step of the phase it was planned in, not earlier
    # than the step before its own
    planned_step = {(u[1], u[2], u[3]): u[4] for u in units.tolist()}
    for (src, doc, start, _n), step in zip(
        p.segments.tolist(), np.repeat(p.seq_step, np.diff(p.seg_offsets)).tolist(), strict=True
    ):
        at = planned_step[(src, doc, start)]
        assert steps[at][1] == steps[step][1] and step >= at - 1
    # deterministic whatever the input order
    again = pack_units(
        units[::-1].copy(), steps, sources, seq_len, batch, cost, quotas=quotas, engine=engine, fair_drops=fair
    )
    for f in FIELDS:
        assert np.array_equal(getattr(again, f), getattr(p, f)), f


@pytest.mark.parametrize("engine", ENGINES)
def test_pack_plan_streams_blocks_of_any_size_to_the_same_packing(engine: str, tmp_path: Path) -> None:
    units, steps, quotas = random_plan(7, 12, 4, 256, 3, 1.1)
    write_plan(tmp_path / "plan.duckdb", units, steps, quotas)
    ref = v1.pack_plan(tmp_path / "plan.duckdb", 256, 4, CostModel(1.0, 16.0))
    assert len(ref.dropped) and len(ref.segments) > 100  # a plan that carries and drops
    for chunk in (1, 37, 10**9):  # a step at a time, blocks cutting anywhere, everything at once
        p = pack_plan(tmp_path / "plan.duckdb", 256, 4, CostModel(1.0, 16.0), engine=engine, chunk_units=chunk)
        for f in FIELDS:
            assert np.array_equal(getattr(p, f), getattr(ref, f)), (chunk, f)


def test_packing_memory_is_bounded_not_python_tuples_per_unit(tmp_path: Path) -> None:
    units, steps, quotas = random_plan(3, 200, 16, 1024, 3, 0.7)  # about 8,600 units, drawn within capacity
    write_plan(tmp_path / "plan.duckdb", units, steps, quotas)
    v1.pack_plan(tmp_path / "plan.duckdb", 1024, 16)  # first calls import what they need: not measured
    pack_plan(tmp_path / "plan.duckdb", 1024, 16, engine="python", chunk_units=512)

    def peak(fn) -> float:  # type: ignore[no-untyped-def]
        tracemalloc.start()
        try:
            fn()
            return tracemalloc.get_traced_memory()[1] / len(units)
        finally:
            tracemalloc.stop()

    ref = peak(lambda: v1.pack_plan(tmp_path / "plan.duckdb", 1024, 16))
    new = peak(lambda: pack_plan(tmp_path / "plan.duckdb", 1024, 16, engine="python", chunk_units=512))
    # the result is 32 bytes per unit; the rest is a few steps' pool and one block, not the plan
    assert new < 80 and new < ref / 4, (new, ref)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_streamed_packing_holds_nothing_of_the_steps_it_handed_out(tmp_path: Path, engine: str) -> None:
    peaks = []
    for n_steps in (60, 240):  # four times the plan
        units, steps, quotas = random_plan(3, n_steps, 16, 1024, 3, 0.7)
        write_plan(tmp_path / f"{n_steps}.duckdb", units, steps, quotas)
        for _ in stream_plan(tmp_path / f"{n_steps}.duckdb", 1024, 16, engine=engine, chunk_units=512).steps:
            pass  # the first pass imports (or compiles) what it needs: not measured
        stream = stream_plan(tmp_path / f"{n_steps}.duckdb", 1024, 16, engine=engine, chunk_units=512)
        tracemalloc.start()
        try:
            handed = sum(len(out.segments) for out in stream.steps)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert handed > 0
    # a collected packing would grow 4× (32 bytes a segment: ~370 kB at 240 steps); the stream holds a block and a
    # few steps (peaks of ~90 kB, which the prefetching thread's timing moves by a third on a loaded machine)
    assert peaks[1] < 2 * peaks[0], peaks


def test_a_unit_at_a_step_the_plan_lacks_is_refused() -> None:
    units = np.array([(5, 0, 0, 0, 3, 0)], dtype=np.int64)
    with pytest.raises(ValueError, match="step 3"):
        pack_units(units, [(0, "a"), (1, "a")], ("x",), 16, 1)


def test_pack_plan_refuses_units_the_quotas_do_not_cover(tmp_path: Path) -> None:
    units, steps, quotas = random_plan(5, 4, 2, 64, 2, 1.0)
    units[-1, 4] = 4  # a step past the plan's last
    write_plan(tmp_path / "plan.duckdb", units[:-1], steps, quotas)
    with duckdb.connect(str(tmp_path / "plan.duckdb")) as con:
        con.execute("INSERT INTO plan_units VALUES (4, 'p0', 's0', 999, 0, 5, 999)")
    with pytest.raises(ValueError, match="step 4, which plan_quotas lacks"):
        pack_plan(tmp_path / "plan.duckdb", 64, 2)
    with duckdb.connect(str(tmp_path / "plan.duckdb")) as con:
        con.execute("UPDATE plan_units SET step = 0, source = 'nowhere' WHERE doc_id = 999")
    with pytest.raises(ValueError, match="a source that plan_quotas lacks"):
        pack_plan(tmp_path / "plan.duckdb", 64, 2)


def test_pack_plan_stops_cleanly_on_a_unit_longer_than_s_in_a_later_block(tmp_path: Path) -> None:
    units, steps, quotas = random_plan(6, 8, 2, 64, 2, 1.0)
    units[units[:, 4] == 7, 0] = 65  # the last step's units: longer than S, in the last of many blocks
    write_plan(tmp_path / "plan.duckdb", units, steps, quotas)
    for engine in ("python", None):
        with pytest.raises(ValueError, match="longer than S=64"):
            pack_plan(tmp_path / "plan.duckdb", 64, 2, engine=engine, chunk_units=1)
