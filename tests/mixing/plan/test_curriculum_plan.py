"""``phase_demand`` and the :class:`Plan` that ``make_plan`` writes and ``preview_plan`` computes: what each phase
asks of each source is the ideal at its boundaries, computed without per-step arrays, and what each phase's
quotas sum to; the summaries agree with the tables written (``plan_quotas``, ``plan_units``, ``plan_sources``,
``plan_phases``) and with the documents; a preview is the same plan; a new plan replaces every table of the old one.

The draw itself (mixture error, one draw per epoch, length limits, chunking, memory): test_plan.py; infeasible
plans: test_feasibility.py; the audit: test_audit.py; the quotas themselves: test_quotas.py.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import cast

import duckdb
import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.errors import WeirError
from mixing.mixfile.mix import Mix, parse_mix
from mixing.plan.curriculum import phase_demand, phase_spans, step_shares
from mixing.plan.curriculum_plan import Plan, PlanError, make_plan, preview_plan
from mixing.plan.fit import Left
from mixing.plan.quotas import step_quotas
from tests.mixing.plan.test_plan import planned_mixes, tables, write_documents


@settings(max_examples=60)
@given(planned_mixes())
def test_phase_demand_is_the_ideal_at_each_phase_boundary_and_what_each_phase_s_quotas_sum_to(
    case: tuple[Mix, dict[str, np.ndarray]],
) -> None:
    """Computed from the phases alone (ramps in closed form), checked against the sum over every step's shares."""
    mix, _ = case
    d = phase_demand(mix)
    names, spans = sorted(mix.sources), phase_spans(mix)
    assert d.sources == tuple(names) and d.spans == spans
    assert d.cum.dtype == np.int64 and d.cum.shape == d.rest.shape == (len(spans) + 1, len(names))
    cap = mix.sequence.length * mix.sequence.global_batch
    per_step = np.vstack([np.zeros((1, len(names))), np.cumsum(step_shares(mix).shares * cap, axis=0)])
    ideal = per_step[[0, *(sp.end_step for sp in spans)]]
    tolerance = 1e-9 * cap * mix.total_steps  # the per-step sum's own float error
    assert np.abs(d.cum + d.rest - ideal).max() <= tolerance
    assert (np.abs(d.rest) <= 0.5).all()

    q = step_quotas(mix)
    sums = q.group_by("phase", "source").agg(pl.col("quota").sum()).rows()
    assert d.tokens() == {(p, s): int(v) for p, s, v in sums}
    assert q.filter(pl.col("step") == mix.total_steps - 1)["cum_quota"].to_list() == d.cum[-1].tolist()


@st.composite
def small_mixes(draw: st.DrawFn) -> tuple[Mix, dict[str, np.ndarray]]:
    """A small mix (S = 64, 8 sequences a step) of 1–3 sources and 1–3 phases, with its documents."""
    names = [f"s{i}" for i in range(draw(st.integers(1, 3)))]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = {n: rng.integers(1, 200, draw(st.integers(60, 150))).astype(np.int64) for n in names}
    phases = []
    for i in range(draw(st.integers(1, 3))):
        weights = {n: draw(st.integers(0, 3)) for n in names}
        weights[names[i % len(names)]] += 1
        mixture = ", ".join(f"{k}: {v}" for k, v in weights.items())
        limit = draw(st.sampled_from(["", ", max_doc_tokens: 64", ", max_doc_tokens: 150"]))
        ramp = f", transition: {{shape: cosine, steps: {draw(st.integers(1, 3))}}}" if i and draw(st.booleans()) else ""
        phases.append(
            f"{{phase: p{i}, steps: {draw(st.integers(3, 10))}, normalize: true, mixture: {{{mixture}}}{limit}{ramp}}}"
        )
    text = (
        f"name: s\nseed: {draw(st.integers(0, 99))}\nsequence: {{length: 64, global_batch: 8}}\nsources:\n"
        + "".join(f"  {n}: {{uri: x, max_epochs: 20}}\n" for n in names)
        + "curriculum:\n"
        + "".join(f"  - {p}\n" for p in phases)
    )
    return parse_mix(text), lengths


def read(db: Path) -> dict[str, pl.DataFrame]:
    with duckdb.connect(str(db), read_only=True) as con:
        return {
            "quotas": con.sql("FROM plan_quotas").pl(),
            "units": con.sql("SELECT *, rowid AS r FROM plan_units ORDER BY rowid").pl(),
            "sources": con.sql("FROM plan_sources").pl(),
            "phases": con.sql("FROM plan_phases").pl(),
            "documents": con.sql("FROM documents").pl(),
        }


def same_frame(a: pl.DataFrame, b: pl.DataFrame) -> bool:
    return a.columns == b.columns and a.rows() == b.rows()


@settings(max_examples=10)
@given(small_mixes())
def test_the_plan_summaries_are_the_tables_written_and_a_preview_is_the_same_plan(
    case: tuple[Mix, dict[str, np.ndarray]],
) -> None:
    mix, lengths = case
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "plan.duckdb"
        write_documents(db, lengths)
        preview = preview_plan(mix, db)
        plan = make_plan(mix, db)
        t = read(db)
    assert isinstance(plan, Plan)
    for field in ("quotas", "per_source", "phases"):
        assert same_frame(getattr(preview, field), getattr(plan, field)), field
    assert (preview.units, preview.warnings) == (plan.units, plan.warnings)

    assert same_frame(plan.quotas, step_quotas(mix))
    assert same_frame(t["quotas"], plan.quotas.sort("step", "source"))
    assert same_frame(t["sources"], plan.per_source) and same_frame(t["phases"], plan.phases)
    units = t["units"]
    assert plan.units == len(units)
    assert units.columns[:-1] == ["step", "phase", "source", "doc_id", "piece", "start", "length", "epoch", "ord"]
    assert units["r"].to_list() == units.sort("step", "source", "ord")["r"].to_list(), "stored by step, source, ord"

    names = sorted(mix.sources)
    ps = plan.per_source
    assert ps["source"].to_list() == names
    for row in ps.iter_rows(named=True):
        s = row["source"]
        mine = units.filter(pl.col("source") == s)
        assert row["tokens_planned"] == plan.quotas.filter(pl.col("source") == s)["quota"].sum()
        assert row["tokens_drawn"] == mine["length"].sum()
        assert row["tokens_available"] == int(lengths[s].sum()) and row["docs_available"] == len(lengths[s])
        # epoch is an integer column; polars types a Series' max() as any Python literal
        assert row["epochs_started"] == (int(cast(int, mine["epoch"].max())) + 1 if len(mine) else 0)
        assert row["max_epochs"] == mix.sources[s].max_epochs

    spans = phase_spans(mix)
    ph = plan.phases
    assert ph["phase"].to_list() == [sp.name for sp in spans]
    assert ph["first_step"].to_list() == [sp.first_step for sp in spans]
    assert ph["steps"].to_list() == [sp.steps for sp in spans]
    assert ph["max_doc_tokens"].to_list() == [sp.max_doc_tokens for sp in spans]
    for row in ph.iter_rows(named=True):
        per = {
            s: plan.quotas.filter((pl.col("phase") == row["phase"]) & (pl.col("source") == s))["quota"].sum()
            for s in names
        }
        assert {s: row[f"tokens_{s}"] for s in names} == per
        assert row["tokens_planned"] == sum(per.values())


MIX = """\
name: r
seed: SEED
sequence: {length: 64, global_batch: 8}
sources:
  a: {uri: x}
  b: {uri: y}
curriculum:
  - {phase: one, steps: 6, mixture: {a: 0.5, b: 0.5}, max_doc_tokens: 64}
  - {phase: two, steps: 9, mixture: {a: 0.2, b: 0.8}, transition: {shape: linear, steps: 3}}
"""


def test_a_new_plan_replaces_every_table_of_the_old_one(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    lengths = {"a": rng.integers(1, 150, 200), "b": rng.integers(1, 150, 200)}
    first, second = (parse_mix(MIX.replace("SEED", s)) for s in ("1", "2"))
    for name in ("twice", "once"):
        write_documents(tmp_path / f"{name}.duckdb", lengths)
    make_plan(first, tmp_path / "twice.duckdb")
    old = tables(tmp_path / "twice.duckdb")
    make_plan(second, tmp_path / "twice.duckdb")
    make_plan(second, tmp_path / "once.duckdb")
    assert tables(tmp_path / "twice.duckdb") == tables(tmp_path / "once.duckdb") != old


def test_a_preview_without_documents_is_one_plan_error_saying_what_to_build(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    duckdb.connect(str(db)).close()
    with pytest.raises(PlanError) as e:
        preview_plan(parse_mix(MIX.replace("SEED", "1")), db)
    assert isinstance(e.value, WeirError) and isinstance(e.value, ValueError)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and str(db) in msg and "weir build" in msg, msg


def test_a_fitted_plan_names_the_deferred_units_no_later_phase_draws_again(tmp_path: Path) -> None:
    """A unit the packing leaves at a phase's end that is longer than every later phase's ``max_doc_tokens`` is
    not planned again: the plan says so for its source (and nothing for the others)."""
    mix = parse_mix(
        "name: m\nseed: 3\nsequence: {length: 64, global_batch: 4}\nsources:\n  a: {uri: x}\n  b: {uri: y}\n"
        "curriculum:\n  - {phase: one, steps: 6, mixture: {a: 0.5, b: 0.5}}\n"
        "  - {phase: two, steps: 4, mixture: {a: 0.5, b: 0.5}, max_doc_tokens: 20}\n"
    )
    rng = np.random.default_rng(4)
    write_documents(tmp_path / "w.duckdb", {"a": rng.integers(1, 60, 400), "b": rng.integers(1, 60, 400)})
    db = tmp_path / "w.duckdb"
    make_plan(mix, db)
    with duckdb.connect(str(db), read_only=True) as con:
        long, short = (
            con.sql(
                f"SELECT ord, step, length FROM plan_units WHERE source = 'a' AND phase = 'one' AND {c} LIMIT 1"
            ).fetchall()[0]
            for c in ("length > 20", "length <= 20")
        )
    answers = [[Left("a", long[0], long[1], "one", 5, long[2]), Left("a", short[0], short[1], "one", 5, short[2])]]
    plan = make_plan(mix, db, probe=lambda _db: answers.pop(0) if answers else [])
    with duckdb.connect(str(db), read_only=True) as con:
        again = con.sql("SELECT ord, phase FROM plan_units WHERE source = 'a'").fetchall()
    assert (short[0], "two") in again and long[0] not in {o for o, _ in again}
    lost = [w for w in plan.warnings if "not planned again" in w]
    assert lost == [
        "source 'a': 1 document(s) a phase end leaves are not planned again (no later phase draws the "
        "source within their length)"
    ]
