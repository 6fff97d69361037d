"""The planner over synthetic documents: mixture error, one draw per epoch, length limits (infeasible plans:
test_feasibility.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixing.mixfile.mix import Mix, parse_mix
from mixing.plan.audit import audit_plan
from mixing.plan.curriculum import phase_spans
from mixing.plan.curriculum_plan import make_plan, preview_plan
from mixing.plan.mixture import GOAL_PHASE, GOAL_WINDOW


def write_documents(db: Path, lengths: dict[str, np.ndarray]) -> None:
    """A ``documents(source, doc_id, n_tokens)`` table in ``db`` (what the planner reads)."""
    src = np.concatenate([np.full(len(v), k) for k, v in lengths.items()])
    ids = np.concatenate([np.arange(len(v)) for v in lengths.values()])
    lens = np.concatenate(list(lengths.values())).astype(np.int64)
    with duckdb.connect(str(db)) as con:
        con.register("d", pa.table({"source": src, "doc_id": ids, "n_tokens": lens}))
        con.execute("CREATE OR REPLACE TABLE documents AS SELECT * FROM d")


def tables(db: Path) -> dict[str, str]:
    """Every table of ``db`` with a digest of its sorted content."""
    out = {}
    with duckdb.connect(str(db), read_only=True) as con:
        for (name,) in con.sql("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall():
            rows = con.sql(f"SELECT * FROM {name} ORDER BY ALL").fetchall()
            out[name] = hashlib.sha256(repr(rows).encode()).hexdigest()
    return out


@st.composite
def planned_mixes(draw: st.DrawFn) -> tuple[Mix, dict[str, np.ndarray]]:
    """A random mix of 1–4 sources and 1–3 phases (ramps, length limits) with enough documents."""
    seq = draw(st.sampled_from([64, 128, 256]))
    batch = 64
    names = [f"s{i}" for i in range(draw(st.integers(1, 4)))]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = {
        n: np.clip(rng.lognormal(np.log(seq / 4), 1.0, draw(st.integers(50, 400))), 1, 3 * seq).astype(np.int64)
        for n in names
    }
    phases = []
    for i in range(draw(st.integers(1, 3))):
        weights = {n: draw(st.integers(0, 5)) for n in names}
        if not any(weights.values()):
            weights[names[0]] = 1
        line = (
            f"{{phase: p{i}, steps: {draw(st.integers(30, 50))}, normalize: true, "
            f"mixture: {{{', '.join(f'{k}: {v}' for k, v in weights.items())}}}"
        )
        if draw(st.booleans()):
            line += f", max_doc_tokens: {draw(st.sampled_from([seq // 2, seq, 2 * seq]))}"
        if i and draw(st.booleans()):
            shape, ramp_steps = draw(st.sampled_from(["linear", "cosine"])), draw(st.integers(1, 20))
            line += f", transition: {{shape: {shape}, steps: {ramp_steps}}}"
        phases.append(line + "}")
    text = (
        f"name: p\nseed: {draw(st.integers(0, 1000))}\nsequence: {{length: {seq}, global_batch: {batch}}}\nsources:\n"
        + "".join(f"  {n}: {{uri: x}}\n" for n in names)
        + "curriculum:\n"
        + "".join(f"  - {p}\n" for p in phases)
    )
    return parse_mix(text), lengths


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(planned_mixes())
def test_random_plans_track_the_mixture_and_draw_each_document_once_per_epoch(
    tmp_path: Path, case: tuple[Mix, dict[str, np.ndarray]]
) -> None:
    mix, lengths = case
    db = tmp_path / f"{mix.fingerprint()[:12]}.duckdb"
    db.unlink(missing_ok=True)
    write_documents(db, lengths)
    plan = make_plan(mix, db)
    audit = audit_plan(db, mix.sequence.length)
    assert audit.mixture.window <= GOAL_WINDOW, audit.mixture
    assert audit.mixture.phase <= GOAL_PHASE, audit.mixture
    assert audit.missing_units == 0
    assert audit.duplicate_units == 0
    assert audit.budget_met, audit.budget
    with duckdb.connect(str(db), read_only=True) as con:
        # every unit of a document in an epoch: its pieces tile the document exactly once
        tiles = con.sql(
            """
            SELECT u.source, u.epoch, u.doc_id, sum(u.length) AS got, count(*) AS n, any_value(d.n_tokens) AS size,
                   bool_and(u.length <= $seq) AS fits
            FROM plan_units u JOIN documents d USING (source, doc_id) GROUP BY ALL
            """,
            params={"seq": mix.sequence.length},
        ).pl()
        assert (tiles["got"] <= tiles["size"]).all() and tiles["fits"].all()
        # length-limited phases draw only documents within the limit
        for span in phase_spans(mix):
            if span.max_doc_tokens is None:
                continue
            longest = con.sql(
                "SELECT max(d.n_tokens) FROM plan_units u JOIN documents d USING (source, doc_id) WHERE u.phase = ?",
                params=[span.name],
            ).fetchall()[0][0]
            assert longest is None or longest <= span.max_doc_tokens
        # units sit on steps of their own phase
        bad = con.sql(
            "SELECT count(*) FROM plan_units u JOIN plan_quotas q USING (step, source) WHERE u.phase <> q.phase"
        ).fetchall()[0][0]
        assert bad == 0
    # epochs per source: drawn tokens ÷ available tokens
    for row in plan.per_source.iter_rows(named=True):
        assert row["epochs"] == pytest.approx(row["tokens_drawn"] / lengths[row["source"]].sum())


def test_plan_is_deterministic_and_preview_writes_nothing(tmp_path: Path) -> None:
    text = (
        "name: d\nseed: 5\nsequence: {length: 128, global_batch: 8}\nsources:\n  a: {uri: x}\n  b: {uri: y}\n"
        "curriculum:\n  - {phase: w, steps: 10, mixture: {a: 0.9, b: 0.1}, max_doc_tokens: 64}\n"
        "  - {phase: m, steps: 30, mixture: {a: 0.3, b: 0.7}, transition: {shape: cosine, steps: 10}}\n"
    )
    mix = parse_mix(text)
    rng = np.random.default_rng(0)
    lengths = {"a": rng.integers(1, 400, 300), "b": rng.integers(1, 400, 200)}
    dbs = []
    for name in ("one", "two"):
        db = tmp_path / f"{name}.duckdb"
        write_documents(db, lengths)
        make_plan(mix, db)
        dbs.append(tables(db))
    assert dbs[0] == dbs[1]
    before = tables(tmp_path / "one.duckdb")
    p = preview_plan(mix, tmp_path / "one.duckdb")
    assert tables(tmp_path / "one.duckdb") == before
    assert p.units > 0
    other_seed = parse_mix(text.replace("seed: 5", "seed: 6"))
    db = tmp_path / "three.duckdb"
    write_documents(db, lengths)
    make_plan(other_seed, db)
    assert tables(db)["plan_units"] != before["plan_units"]


def test_plan_does_not_depend_on_the_draw_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The draw streams each source's order in chunks of documents; the plan must not change with the chunk."""
    import mixing.plan.draws as draws_mod

    mix = parse_mix(
        "name: t\nseed: 9\nsequence: {length: 64, global_batch: 16}\nsources:\n  a: {uri: x}\n  b: {uri: y}\n"
        "curriculum:\n  - {phase: w, steps: 30, mixture: {a: 0.5, b: 0.5}, max_doc_tokens: 16}\n"
        "  - {phase: m, steps: 40, mixture: {a: 0.8, b: 0.2}, transition: {shape: linear, steps: 15}}\n"
        "  - {phase: z, steps: 20, mixture: {a: 0.1, b: 0.9}, max_doc_tokens: 40}\n"
    )
    rng = np.random.default_rng(3)
    lengths = {"a": rng.integers(1, 200, 400), "b": rng.integers(1, 100, 300)}
    digests = []
    for chunk in (1 << 21, 7):  # one chunk per epoch; chunks of 7 documents
        monkeypatch.setattr(draws_mod, "CHUNK_DOCS", chunk)
        db = tmp_path / f"chunk{chunk}.duckdb"
        write_documents(db, lengths)
        make_plan(mix, db)
        digests.append(tables(db))
        assert audit_plan(db, 64).duplicate_units == 0
    assert digests[0] == digests[1]
    with duckdb.connect(str(tmp_path / "chunk7.duckdb"), read_only=True) as con:
        assert con.sql("SELECT max(epoch) FROM plan_units").fetchall()[0][0] >= 1  # several epochs were needed


def test_plan_under_a_small_duckdb_memory_limit_spills_and_is_the_same(tmp_path: Path) -> None:
    """``make_plan(config=...)`` bounds DuckDB; past the limit it spills the drawn units and the final sort,
    and the plan written is the same as without a limit."""
    mix = parse_mix(
        "name: big\nseed: 3\nsequence: {length: 256, global_batch: 64}\nsources:\n  a: {uri: x}\n  b: {uri: y}\n"
        "curriculum:\n  - {phase: w, steps: 40, mixture: {a: 0.5, b: 0.5}, max_doc_tokens: 64}\n"
        "  - {phase: m, steps: 1800, mixture: {a: 0.7, b: 0.3}, transition: {shape: cosine, steps: 100}}\n"
    )
    rng = np.random.default_rng(1)
    lengths = {"a": np.clip(rng.lognormal(4, 1.2, 200_000), 1, 2000), "b": rng.integers(1, 300, 100_000)}
    digests = []
    runs: tuple[tuple[str, dict[str, str | int | bool]], ...] = (
        ("free", {}),
        ("bounded", {"memory_limit": "16MB", "threads": 1}),
    )
    for name, config in runs:
        db = tmp_path / f"{name}.duckdb"
        write_documents(db, lengths)
        plan = make_plan(mix, db, config=config)
        digests.append(tables(db))
    assert plan.units > 250_000  # 9 columns of them: ~20 MB uncompressed, more than 16 MB
    assert digests[0] == digests[1]


def test_the_plan_holds_no_array_per_document(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's share of the plan is one chunk of the draw order and one batch of units, whatever the number
    of documents: 4× the documents (the same tokens, the same steps) leave its traced peak where it was. It
    fails with an array per document (the lengths and a numpy permutation: 12 bytes each, 5.8 MB here)."""
    import tracemalloc

    import mixing.plan.curriculum_plan as plan_mod
    import mixing.plan.draws as draws_mod

    monkeypatch.setattr(draws_mod, "CHUNK_DOCS", 1 << 12)
    monkeypatch.setattr(plan_mod, "_FLUSH_ROWS", 1 << 12)
    mix = parse_mix(
        "name: m\nseed: 2\nsequence: {length: 1024, global_batch: 16}\nsources:\n  a: {uri: x}\n  b: {uri: y}\n"
        "curriculum:\n  - {phase: p, steps: 90, mixture: {a: 0.6, b: 0.4}}\n"
    )
    peaks = []
    for n in (120_000, 480_000):  # 2.4 M tokens of each source either way
        db = tmp_path / f"{n}.duckdb"
        write_documents(db, {"a": np.full(n, 2_400_000 // n), "b": np.full(n, 2_400_000 // n)})
        tracemalloc.start()
        plan = make_plan(mix, db, config={"threads": 1})
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert plan.units > 0.5 * n
    assert peaks[1] < 1.3 * peaks[0] + (1 << 20), peaks
