"""``audit_plan``, the checks of a written plan independent of how it was computed: a sound plan passes every
check; each kind of damage to ``plan_units`` (a unit past its document's end, of a document that is not there,
empty, or drawn twice in an epoch; units removed) is counted exactly, the budget per phase and source allows one
unit (S tokens) of slack and no more; the audit reads the file without changing it.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixing.mixfile.mix import parse_mix
from mixing.plan.audit import PlanAudit, audit_plan
from mixing.plan.curriculum_plan import make_plan
from mixing.plan.mixture import plan_mixture_error
from tests.mixing.plan.test_plan import tables, write_documents

SEQ = 64
MIX = f"""\
name: audited
seed: 11
sequence: {{length: {SEQ}, global_batch: 8}}
sources:
  a: {{uri: x}}
  b: {{uri: y}}
curriculum:
  - {{phase: warm, steps: 10, mixture: {{a: 0.5, b: 0.5}}, max_doc_tokens: 64}}
  - {{phase: main, steps: 20, mixture: {{a: 0.3, b: 0.7}}, transition: {{shape: cosine, steps: 5}}}}
"""


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A DuckDB file holding documents and a plan of :data:`MIX` (two sources, a length-limited phase)."""
    db = tmp_path_factory.mktemp("audit") / "plan.duckdb"
    rng = np.random.default_rng(5)
    write_documents(db, {"a": rng.integers(1, 300, 400), "b": rng.integers(1, 200, 300)})
    UNITS[db] = make_plan(parse_mix(MIX), db).units
    assert UNITS[db] >= 100
    return db


UNITS: dict[Path, int] = {}  # rows of plan_units in each planned file


def expected_budget(db: Path) -> pl.DataFrame:
    """phase, source, tokens_planned, tokens_drawn, short: from the tables, one unit of slack."""
    with duckdb.connect(str(db), read_only=True) as con:
        quotas = con.sql("SELECT step, phase, source, quota FROM plan_quotas").pl()
        units = con.sql("SELECT phase, source, length FROM plan_units").pl()
    first = quotas.group_by("phase").agg(pl.col("step").min().alias("first"))
    planned = quotas.group_by("phase", "source").agg(pl.col("quota").sum().alias("tokens_planned"))
    drawn = units.group_by("phase", "source").agg(pl.col("length").sum().alias("tokens_drawn"))
    return (
        planned.join(drawn, on=["phase", "source"], how="left")
        .join(first, on="phase")
        .with_columns(pl.col("tokens_drawn").fill_null(0))
        .with_columns(short=pl.max_horizontal(0, pl.col("tokens_planned") - SEQ - pl.col("tokens_drawn")))
        .sort("first", "source")
        .select("phase", "source", "tokens_planned", "tokens_drawn", "short")
    )


def same_budget(audit: PlanAudit, db: Path) -> None:
    got = audit.budget.with_columns(pl.col(pl.Int64, pl.Int32).cast(pl.Int64))
    want = expected_budget(db).with_columns(pl.col(pl.Int64, pl.Int32).cast(pl.Int64))
    assert got.columns == want.columns and got.rows() == want.rows(), (got, want)


def test_a_sound_plan_passes_every_check_and_is_only_read(planned: Path) -> None:
    before = tables(planned)
    audit = audit_plan(planned, SEQ)
    assert tables(planned) == before
    assert (audit.missing_units, audit.duplicate_units) == (0, 0)
    assert audit.budget_met and (audit.budget["short"] == 0).all()
    assert audit.mixture == plan_mixture_error(planned)
    same_budget(audit, planned)
    assert audit.budget["phase"].to_list() == ["warm", "warm", "main", "main"], "phases in step order"
    # make_plan draws what it plans give or take half a unit at the end of each phase
    assert ((audit.budget["tokens_drawn"] - audit.budget["tokens_planned"]).abs() <= SEQ).all()


@contextmanager
def damaged(planned: Path, *statements: str) -> Iterator[Path]:
    """A copy of the plan with ``statements`` run on it (``$rows``: the rowids to damage)."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "plan.duckdb"
        shutil.copyfile(planned, db)
        with duckdb.connect(str(db)) as con:
            for sql in statements:
                con.execute(sql)
        yield db


def pick(planned: Path, seed: int, k: int) -> str:
    """``k`` distinct rowids of ``plan_units``, as a SQL list."""
    chosen = np.random.default_rng(seed).choice(UNITS[planned], k, replace=False)
    return "(" + ", ".join(map(str, sorted(chosen.tolist()))) + ")"


MISSING = {  # each turns a unit into one with no such document piece
    "past the end": "UPDATE plan_units u SET start = d.n_tokens - u.length + 1 FROM documents d "
    "WHERE d.source = u.source AND d.doc_id = u.doc_id AND u.rowid IN {rows}",
    "no such document": "UPDATE plan_units SET doc_id = -1 - rowid WHERE rowid IN {rows}",
    "empty": "UPDATE plan_units SET length = 0 WHERE rowid IN {rows}",
    "negative start": "UPDATE plan_units SET start = -1 WHERE rowid IN {rows}",
}


@settings(max_examples=12)
@given(kind=st.sampled_from(sorted(MISSING)), seed=st.integers(0, 2**32 - 1), k=st.integers(1, 12))
def test_each_unit_with_no_such_document_piece_is_counted_once(planned: Path, kind: str, seed: int, k: int) -> None:
    with damaged(planned, MISSING[kind].format(rows=pick(planned, seed, k))) as db:
        audit = audit_plan(db, SEQ)
        assert audit.missing_units == k, kind
        assert audit.duplicate_units == 0


@settings(max_examples=6)
@given(seed=st.integers(0, 2**32 - 1), k=st.integers(1, 12), again=st.integers(1, 3))
def test_each_extra_draw_of_a_unit_in_its_epoch_is_counted(planned: Path, seed: int, k: int, again: int) -> None:
    """``again`` more copies of ``k`` units (on the same steps): k × again duplicates; the same unit in another
    epoch is not one."""
    rows = pick(planned, seed, k)
    copies = [f"INSERT INTO plan_units SELECT * FROM plan_units WHERE rowid IN {rows}"]
    with damaged(planned, *copies * again) as db:
        audit = audit_plan(db, SEQ)
        assert (audit.missing_units, audit.duplicate_units) == (0, k * again)
    other_epoch = (
        f"INSERT INTO plan_units SELECT * REPLACE (epoch + 1000 AS epoch) FROM plan_units WHERE rowid IN {rows}"
    )
    with damaged(planned, other_epoch) as db:
        assert audit_plan(db, SEQ).duplicate_units == 0


PAIRS = [("warm", "a"), ("warm", "b"), ("main", "a"), ("main", "b")]


@settings(max_examples=6)
@given(keep=st.lists(st.floats(0.0, 1.0), min_size=len(PAIRS), max_size=len(PAIRS)))
def test_the_budget_allows_one_unit_of_slack_and_no_more(planned: Path, keep: list[float]) -> None:
    """The last units of each phase and source's draw removed (``keep`` of them left): ``short`` is what is
    missing beyond S tokens, each pair on its own, and the budget is met exactly when every one is 0."""
    kept = " ".join(f"WHEN phase = '{p}' AND source = '{s}' THEN {k!r}" for (p, s), k in zip(PAIRS, keep, strict=True))
    drop = f"""DELETE FROM plan_units WHERE rowid IN (
        SELECT rowid FROM (
            SELECT rowid, CASE {kept} END AS keep,
                   row_number() OVER (PARTITION BY phase, source ORDER BY ord DESC) AS last,
                   count(*) OVER (PARTITION BY phase, source) AS n
            FROM plan_units)
        WHERE last <= n - round(keep * n))"""
    with damaged(planned, drop) as db:
        audit = audit_plan(db, SEQ)
        same_budget(audit, db)
    assert audit.missing_units == 0 and audit.duplicate_units == 0
    for row in audit.budget.iter_rows(named=True):
        assert row["short"] == max(0, row["tokens_planned"] - SEQ - row["tokens_drawn"]), row
    assert audit.budget_met == (audit.budget["short"] == 0).all()


def test_a_phase_and_source_with_no_units_at_all_is_short_by_all_but_one_unit(planned: Path) -> None:
    with damaged(planned, "DELETE FROM plan_units WHERE phase = 'main' AND source = 'b'") as db:
        audit = audit_plan(db, SEQ)
    row = audit.budget.filter((pl.col("phase") == "main") & (pl.col("source") == "b")).row(0, named=True)
    assert row["tokens_drawn"] == 0 and row["short"] == row["tokens_planned"] - SEQ > 0
    assert not audit.budget_met
