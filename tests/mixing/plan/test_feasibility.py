"""Infeasible plans name every phase, source and token count at once and write nothing, refused before any
per-step array is made or any document drawn (in time and memory independent of the steps); a feasible plan's
warnings."""

from __future__ import annotations

import re
import time
import tracemalloc
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

import mixing.mixfile.mix as mix_module
import mixing.plan.curriculum as curriculum_module
import mixing.plan.curriculum_plan as plan_module
from mixing.mixfile.mix import parse_mix
from mixing.plan.curriculum_plan import PlanError, make_plan, preview_plan
from mixing.plan.feasibility import plan_warnings
from tests.mixing.plan.test_plan import tables, write_documents

INFEASIBLE = """\
name: i
sequence: {length: 128, global_batch: 8}
sources:
  a: {uri: x, max_epochs: 1}
  b: {uri: y}
curriculum:
  - {phase: warm, steps: 10, mixture: {a: 0.5, b: 0.5}, max_doc_tokens: MAXDOC}
  - {phase: main, steps: STEPS, mixture: {a: 0.5, b: 0.5}}
"""


@pytest.mark.parametrize(
    ("maxdoc", "steps", "words"),
    [
        # a runs out under its cap: 10+40 steps × 512 tokens of a > 20,000 tokens × 1 epoch
        (
            "1000",
            "40",
            ["source 'a' runs out in phase 'main'", "needs 25600 tokens", "has 20000 tokens", "max_epochs is 1"],
        ),
        # the warmup's length limit leaves nothing of a
        ("5", "1", ["phase(s) 'warm'", "source 'a'", "at most 5 tokens", "no document that short"]),
        # the length limit leaves too few tokens of a for the warmup within one epoch
        ("100", "1", ["phase(s) 'warm' need 5120 tokens of source 'a'", "at most 100 tokens", "hold 1000 tokens"]),
    ],
)
def test_infeasible_plan_names_phase_source_tokens_and_writes_nothing(
    tmp_path: Path, maxdoc: str, steps: str, words: list[str]
) -> None:
    db = tmp_path / "w.duckdb"
    # a: 10 documents of 100 tokens and 90 of 211 (20,000 tokens); b: plenty
    write_documents(db, {"a": np.array([100] * 10 + [211] * 89 + [221]), "b": np.full(500, 100)})
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.sql("SELECT sum(n_tokens) FROM documents WHERE source = 'a'").fetchall()[0][0] == 20000
    ok = parse_mix(INFEASIBLE.replace("MAXDOC", "1000").replace("STEPS", "1"))
    make_plan(ok, db)  # an earlier, feasible plan stays as it was
    before = tables(db)
    bad = parse_mix(INFEASIBLE.replace("MAXDOC", maxdoc).replace("STEPS", steps))
    with pytest.raises(PlanError) as e:
        make_plan(bad, db)
    for w in words:
        assert w in str(e.value), str(e.value)
    assert tables(db) == before


def test_infeasible_plan_names_every_phase_and_source_at_once(tmp_path: Path) -> None:
    """Three sources, each infeasible in its own way: one error lists all, with tokens had and needed."""
    db = tmp_path / "w.duckdb"
    write_documents(
        db, {"a": np.full(100, 200), "b": np.full(100, 200), "c": np.array([], np.int64), "d": np.full(9, 9)}
    )
    mix = parse_mix(
        "name: i\nsequence: {length: 128, global_batch: 8}\nsources:\n  a: {uri: x, max_epochs: 1}\n"
        "  b: {uri: y, max_epochs: 1}\n  c: {uri: z}\n  d: {uri: w}\n"
        "curriculum:\n  - {phase: warm, steps: 10, mixture: {a: 0.3, b: 0.3, c: 0.3, d: 0.1}, max_doc_tokens: 100}\n"
        "  - {phase: main, steps: 60, mixture: {a: 0.5, b: 0.5}}\n"
    )
    before = tables(db)
    with pytest.raises(PlanError) as e:
        make_plan(mix, db)
    lines = str(e.value).splitlines()
    assert lines[0] == "the plan cannot be met (5 problems):", lines
    body = "\n".join(lines[1:])
    for s in ("a", "b"):  # over max_epochs in main, and no document short enough for warm
        assert f"source {s!r} runs out in phase 'main': the plan needs " in body
        assert "has 20000 tokens and max_epochs is 1" in body
        assert f"phase(s) 'warm' need 3072 tokens of source {s!r} from documents of at most 100 tokens" in body
    assert "phase 'warm' needs 3072 tokens of source 'c', but it has no documents" in body
    assert len(lines) == 6 and all(line.startswith("- ") for line in lines[1:])
    assert tables(db) == before


def test_a_segment_that_runs_out_after_an_earlier_one_drew_its_short_documents(tmp_path: Path) -> None:
    """Enough short documents of a in all, but the unlimited phase before takes its share of them first."""
    db = tmp_path / "w.duckdb"
    write_documents(db, {"a": np.array([20] * 50 + [60] * 50), "b": np.full(500, 25)})
    mix = parse_mix(
        "name: s\nsequence: {length: 64, global_batch: 4}\nsources:\n  a: {uri: x, max_epochs: 1}\n  b: {uri: y}\n"
        "curriculum:\n  - {phase: p1, steps: 20, mixture: {a: 0.5, b: 0.5}}\n"
        "  - {phase: p2, steps: 5, mixture: {a: 0.5, b: 0.5}, max_doc_tokens: 30}\n"
    )
    before = tables(db)
    with pytest.raises(PlanError) as e:
        make_plan(mix, db)
    found = re.fullmatch(
        r"phase 'p2' runs out of source 'a' from documents of at most 30 tokens: the phases up to it need 3200 "
        r"tokens of it, but only (\d+) can be drawn in order within max_epochs 1 \(4000 tokens per epoch\)",
        str(e.value),
    )
    assert found, str(e.value)
    assert int(found[1]) < 3200  # how many depends on which short documents p1's draw order took first
    assert tables(db) == before


def test_an_infeasible_plan_is_refused_before_any_step_is_made_whatever_the_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """10**9 steps (past the mix file's limit, lifted here): the refusal comes from the phases and the documents'
    token counts alone, in well under a second and a few MB, with the message of any infeasible plan; the
    uncapped source b, which a draw would repeat for ever, is never drawn."""
    db = tmp_path / "w.duckdb"
    write_documents(db, {"a": np.full(100, 200), "b": np.full(100, 200)})
    monkeypatch.setattr(mix_module, "MAX_STEPS", 10**10)  # the run's limit (a phase's own: tokens, not steps)
    steps, ramp = 10**9, 10**7  # the ramp at its own limit
    mix = parse_mix(
        "name: h\nsequence: {length: 128, global_batch: 8}\nsources:\n  a: {uri: x, max_epochs: 2}\n  b: {uri: y}\n"
        "curriculum:\n  - {phase: warm, steps: 10, mixture: {a: 0.5, b: 0.5}}\n"
        f"  - {{phase: huge, tokens: {1024 * steps}, mixture: {{a: 0.25, b: 0.75}}, "
        f"transition: {{shape: cosine, steps: {ramp}}}}}\n"
    )
    assert mix.total_steps == steps + 10

    def per_step(*_a: object, **_k: object) -> None:
        raise AssertionError("a per-step array or a draw before the plan was judged feasible")

    for module, name in [(plan_module, "step_quotas"), (plan_module, "_draw"), (curriculum_module, "step_shares")]:
        monkeypatch.setattr(module, name, per_step)
    # warm: 10 × 512 tokens of a; huge: 1024 a step, 0.25 of them after its cosine ramp from 0.5, which asks
    # (0.5 + 0.25) / 2 on average
    need = 10 * 512 + 1024 * ((steps - ramp) // 4 + ramp * 3 // 8)
    expected = (
        f"source 'a' runs out in phase 'huge': the plan needs {need} tokens of it ({need / 20000:.2f} epochs) "
        "but it has 20000 tokens and max_epochs is 2 (40000 tokens at most)"
    )
    for plan in (make_plan, preview_plan):
        tracemalloc.start()
        t0 = time.perf_counter()
        with pytest.raises(PlanError) as e:
            plan(mix, db)
        seconds, (_, peak) = time.perf_counter() - t0, tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert str(e.value) == expected
        assert seconds < 5 and peak < 20 * 2**20, (plan.__name__, seconds, peak)


def test_warnings_name_undrawn_uncapped_repeats_and_sources_at_their_cap() -> None:
    mix = parse_mix(
        "name: w\nsequence: {length: 64, global_batch: 4}\nsources:\n  a: {uri: x}\n  b: {uri: y, max_epochs: 2}\n"
        "  c: {uri: z}\n  d: {uri: v, max_epochs: 3}\n"
        "curriculum:\n  - {phase: p, steps: 5, mixture: {a: 0.5, b: 0.25, d: 0.25}}\n"
    )
    per_source = pl.DataFrame(
        {
            "source": ["a", "b", "c", "d"],
            "tokens_planned": [10, 10, 0, 10],
            "epochs": [1.5, 2.0, 0.0, 1.2],
            "max_epochs": [float("inf"), 2.0, float("inf"), 3.0],
        }
    )
    assert plan_warnings(mix, per_source) == [
        "source 'a' is repeated 1.50 times (no max_epochs caps it)",
        "source 'b' is drawn 2.00 epochs, at its max_epochs 2",
        "source 'c' is declared but no phase draws it",
    ]


SHORT_WARMUP = """\
name: s
sequence: {length: 128, global_batch: 8}
sources:
  a: {uri: x}
  b: {uri: y}
  c: {uri: z, max_epochs: 1}
curriculum:
  - {phase: warm, steps: 10, mixture: {a: 0.5, b: 0.25, c: 0.25}, max_doc_tokens: 150}
  - {phase: main, steps: 2, mixture: {a: 0.5, b: 0.25, c: 0.25}}
"""


def test_a_phase_cycling_the_few_short_documents_of_a_source_is_warned_about(tmp_path: Path) -> None:
    """The warmup draws 5,120 tokens of a from its ten documents of ≤ 150 tokens (1,000): each five times over,
    though a is drawn 0.31 of an epoch in all, so only a warning on the short documents says so; c's short
    documents are drawn exactly its max_epochs (1); b's limit leaves out none of its documents: no warning."""
    db = tmp_path / "w.duckdb"
    write_documents(
        db,
        {
            "a": np.array([100] * 10 + [211] * 90),
            "b": np.full(500, 100),
            "c": np.array([128] * 20 + [211] * 50),
        },
    )
    plan = make_plan(parse_mix(SHORT_WARMUP), db)
    assert plan.warnings == (
        "phase(s) 'warm' draw 5120 tokens of source 'a' from its 10 documents of at most 150 tokens (1000 tokens): "
        "each 5.12 times (no max_epochs caps it)",
        "phase(s) 'warm' draw 2560 tokens of source 'c' from its 20 documents of at most 150 tokens (2560 tokens): "
        "each 1.00 times, at its max_epochs 1",
    )
    with duckdb.connect(str(db), read_only=True) as con:  # what the warning says is what the plan drew
        epochs, docs = con.sql(
            "SELECT count(DISTINCT epoch), count(DISTINCT doc_id) FROM plan_units WHERE source = 'a' AND step < 10"
        ).fetchall()[0]
    assert (epochs, docs) == (6, 10)
