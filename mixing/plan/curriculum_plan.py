"""The curriculum plan: per-step token quotas per source, and which document pieces each step draws.

Documents longer than the sequence length S are cut into S-sized pieces (only those); a *unit* is a whole
document or one such piece. Tables written to the build's DuckDB file, all at once and only when the whole
plan is feasible (:mod:`mixing.plan.feasibility`; judged from what each phase asks of each source,
:func:`~mixing.plan.curriculum.phase_demand`, before any per-step array is made or any document drawn):

- ``plan_quotas(step, phase, source, quota, cum_quota, share, held)``: tokens of ``source`` planned for ``step``
  from the (ramped) mixture; ``cum_quota`` is the rounded cumulative ideal, so rounding error is carried
  forward and never accumulates (Σ quota over any prefix of steps is within 0.5 token of ideal); ``held``: what
  of it the step does not draw, the fit's (:mod:`mixing.plan.quotas`).
- ``plan_units(step, phase, source, doc_id, piece, start, length, epoch, ord)``: the units each step draws.
  Each source's units come in a seeded order (a fresh order of its documents for every epoch, sorted by
  DuckDB: :mod:`mixing.plan.order`);
  a phase with ``max_doc_tokens`` skips longer documents, which stay available to later phases.
- ``plan_phases``, ``plan_sources``: the summaries :class:`Plan` returns.

Deterministic for the same documents, mix and seed.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa

from contract.errors import WeirError
from mixing.mixfile.mix import Mix
from mixing.plan.curriculum import Held, PhaseSpan, length_segments, phase_demand
from mixing.plan.draws import SegmentQuota, Trained, draw_source
from mixing.plan.feasibility import available, epochs_needed, plan_warnings, short_document_warnings, shortfalls
from mixing.plan.fit import Deferred, Probe, fit, not_drawn_again, still_left
from mixing.plan.order import SortedOrder
from mixing.plan.quotas import step_quotas

__all__ = ["Past", "Plan", "PlanError", "make_plan", "preview_plan"]


class PlanError(WeirError, ValueError):
    """The mix cannot be planned with the documents there are (names phase, source, tokens)."""


@dataclass(frozen=True)
class Past:
    """A continuation's past (:mod:`mixing.continuation`): its steps before ``at`` are its base's, which trained,
    per source name, ``tokens`` tokens and the pieces ``trained`` counts. The plan then covers the steps from
    ``at`` on only (``plan_quotas`` and ``plan_units`` start there), each source's draw skipping what the base
    trained, and its feasibility counts those tokens as spent."""

    at: int
    trained: Mapping[str, Trained]
    tokens: Mapping[str, int]
    quotas: pl.DataFrame  # the base's ``plan_quotas`` rows of the steps before ``at``


@dataclass(frozen=True)
class Plan:
    """A plan's summaries.

    ``quotas``: the ``plan_quotas`` frame (of a continuation: every step's, its base's before the switch
    included, where ``plan_quotas`` starts at the switch). ``per_source``: source, tokens_planned, tokens_drawn,
    tokens_available, docs_available, epochs (tokens drawn ÷ available, float), epochs_started,
    max_epochs. ``phases``: phase, first_step, steps, transition, max_doc_tokens, tokens_planned and one
    ``tokens_<source>`` column per source. ``units``: rows of ``plan_units``. ``warnings``: sentences.
    ``plans``: how many plans were drawn to fit it to its packing (1: not fitted, or its first packing dropped no
    document whole); ``deferred``: the units the fit deferred past their phase.
    """

    quotas: pl.DataFrame
    per_source: pl.DataFrame
    phases: pl.DataFrame
    units: int
    warnings: tuple[str, ...] = ()
    plans: int = 1
    deferred: int = 0


def make_plan(
    mix: Mix,
    db_path: Path,
    config: Mapping[str, str | int | bool] | None = None,
    past: Past | None = None,
    spread: bool = True,
    probe: Probe | None = None,
) -> Plan:
    """Plan ``mix`` over the ``documents`` table of ``db_path`` and write the plan tables there.

    Raises :class:`PlanError` when a source with a positive share has no documents, would need more epochs
    than its ``max_epochs``, or a length limit leaves too few tokens; one error names every such phase and
    source. That is judged from what each phase asks of each source
    (:func:`~mixing.plan.curriculum.phase_demand`) and the documents' token counts, before any per-step array
    is made or any document drawn: a refusal takes seconds and memory independent of the steps asked for.
    A phase that the draw itself leaves short (possible only under a ``max_epochs``) is raised after the draw.
    Nothing is written in either case. ``config``: DuckDB settings for the connection (e.g.
    ``memory_limit``, ``threads``, ``temp_directory``): the draw streams, and DuckDB spills past its limit.
    ``past``: a continuation's (see :class:`Past`). ``spread``: the pieces of a long document spread over the
    order (the plan's way, :mod:`mixing.plan.draws`); False keeps them consecutive, for comparison.

    ``probe``: the packing's verdict on the plan written (:data:`Probe`): the units starting a document that the
    packing leaves at a phase's end, documents the trainer would not get in that phase. The plan is then drawn
    again with each such unit deferred past its phase (:func:`mixing.plan.draws.draw_source`: it opens the next
    phase that draws its source) and the step that drew it drawing that many tokens fewer of the source (``held``
    in ``plan_quotas``), so the phase's other units keep their steps and it packs almost as it did; the later
    phases are packed anew and probed in turn, until the packing leaves none or
    :data:`mixing.plan.fit.FIT_ROUNDS` plans were drawn. A phase's packing gaps make the drop; the plan drawing
    short of them keeps it off whole documents.
    The plan's ``warnings`` are those of the plan as first drawn, the words :func:`preview_plan` gives
    (:func:`mixing.plan.fit.fit` draws the plans), then one per source with deferred units that no later phase
    draws within their length (they are not planned again), and one when the fit ran out of plans with documents
    still dropped whole.
    """

    plans = 0

    def draw(held: Held, deferred: Deferred) -> Plan:
        nonlocal plans
        plans += 1
        with duckdb.connect(str(db_path), config=dict(config or {})) as con:
            return _plan(con, mix, persist=True, past=past, spread=spread, held=held, deferred=deferred)

    if probe is None:
        return draw({}, {})
    final = {s: ph for (ph, s), tokens in phase_demand(mix).tokens().items() if tokens}  # spans in order
    first, fitted, deferred, left = fit(draw, probe, db_path, final)
    warnings = first.warnings + not_drawn_again(db_path, deferred, config) + still_left(left)
    return replace(fitted, warnings=warnings, plans=plans, deferred=sum(map(len, deferred.values())))


def preview_plan(
    mix: Mix, db_path: Path, config: Mapping[str, str | int | bool] | None = None, past: Past | None = None
) -> Plan:
    """The same plan as :func:`make_plan`, computed from ``db_path`` opened read-only; writes nothing
    (what DuckDB spills goes to a temporary folder removed on return, not ``.tmp`` in the working folder)."""
    with (
        tempfile.TemporaryDirectory(prefix="weir-preview-") as tmp,
        duckdb.connect(config={"temp_directory": tmp, **(config or {})}) as con,
    ):
        path = str(db_path).replace("'", "''")
        con.execute(f"ATTACH '{path}' AS build (READ_ONLY)")
        tables = {
            r[0] for r in con.sql("SELECT table_name FROM duckdb_tables() WHERE database_name='build'").fetchall()
        }
        if "documents" not in tables:
            raise PlanError(f"{db_path}: no documents table; build the mix (weir build) up to length_stats first")
        con.execute("CREATE TEMP VIEW documents AS SELECT * FROM build.documents")
        return _plan(con, mix, persist=False, past=past)


def _plan(
    con: duckdb.DuckDBPyConnection,
    mix: Mix,
    persist: bool,
    past: Past | None = None,
    spread: bool = True,
    held: Held | None = None,
    deferred: Deferred | None = None,
) -> Plan:
    demand = phase_demand(mix)
    spans, names = demand.spans, list(demand.sources)
    need = demand.tokens()
    quotas = None
    if past is not None:  # what is asked from the switch on: the quotas of those steps
        quotas = step_quotas(mix, held).filter(pl.col("step") >= past.at)
        by = quotas.group_by("phase", "source").agg(pl.col("quota").sum())
        need = {(sp.name, s): 0 for sp in spans for s in names} | {(r[0], r[1]): int(r[2]) for r in by.iter_rows()}
    have, short = available(con, spans)
    problems: list[str] = []
    epochs: dict[str, int] = {}
    for s in names:
        spent = past.tokens.get(s, 0) if past is not None else 0
        epochs[s], found = epochs_needed(mix, s, spans, need, have, short, spent)
        problems += found
    _refuse(problems)  # before any array per step or draw: an infeasible plan costs what its phases do, not its steps

    if quotas is None:
        quotas = step_quotas(mix, held)
    _draw(con, mix, quotas, spans, epochs, past, spread, deferred)
    got = {(spans[r[0]].name, names[r[1]]): int(r[2]) for r in con.sql(_TAKEN).fetchall()}
    kept = quotas.group_by("phase", "source").agg(pl.col("held").sum())
    drawn_need = dict(need) | {(r[0], r[1]): need[r[0], r[1]] - int(r[2]) for r in kept.iter_rows()}
    _refuse(shortfalls(mix, spans, drawn_need, got, have, epochs))
    per_source, phases = _summaries(con, mix, spans, need, have)
    n_units = con.sql("SELECT count(*) FROM _taken").fetchall()[0][0]
    if persist:
        con.register("quotas_in", quotas.to_arrow())
        con.register("per_source_in", per_source.to_arrow())
        con.register("phases_in", phases.to_arrow())
        con.execute("BEGIN TRANSACTION")  # readers see the old plan tables or all the new ones
        try:
            con.execute("CREATE OR REPLACE TABLE plan_quotas AS SELECT * FROM quotas_in ORDER BY step, source")
            con.execute("CREATE OR REPLACE TABLE plan_units AS FROM _plan_units")  # ordered by step, source, ord
            con.execute("CREATE OR REPLACE TABLE plan_sources AS SELECT * FROM per_source_in")
            con.execute("CREATE OR REPLACE TABLE plan_phases AS SELECT * FROM phases_in")
        except BaseException:
            con.execute("ROLLBACK")
            raise
        con.execute("COMMIT")
    shown = quotas if past is None else _whole(past.quotas, quotas)  # a continuation's cover its base's steps too
    warnings = plan_warnings(mix, per_source) + short_document_warnings(mix, spans, need, have, short)
    return Plan(shown, per_source, phases, int(n_units), tuple(warnings))


def _whole(before: pl.DataFrame, after: pl.DataFrame) -> pl.DataFrame:
    """The quotas of a whole continuation: its base's ``before`` its switch, then its own ``after``, every
    (step, source) of either present (0 where a source has none: a source new here, or one it no longer names)."""
    if "held" not in before.columns:  # a base planned before phases held documents back
        before = before.with_columns(pl.lit(0, pl.Int64).alias("held"))
    both = pl.concat([before.select(after.columns).cast(after.schema), after])  # type: ignore[arg-type]
    phase = both.select("step", "phase").unique("step")
    grid = phase.join(both.select("source").unique(), how="cross")
    out = grid.join(both.drop("phase"), on=["step", "source"], how="left")
    return (
        out.with_columns(pl.col("quota", "cum_quota", "share", "held").fill_null(0))
        .select(after.columns)
        .sort("step", "source")
    )


def _refuse(problems: list[str]) -> None:
    """Raise one :class:`PlanError` naming every problem, if any: all at once, so that a fix for one does not
    reveal the next on the following run."""
    if problems:
        raise PlanError(
            problems[0]
            if len(problems) == 1
            else f"the plan cannot be met ({len(problems)} problems):\n" + "\n".join(f"- {p}" for p in problems)
        )


_TAKEN = "SELECT ph, src, sum(length)::BIGINT FROM _taken GROUP BY 1, 2"


def _draw(
    con: duckdb.DuckDBPyConnection,
    mix: Mix,
    quotas: pl.DataFrame,
    spans: tuple[PhaseSpan, ...],
    epochs: dict[str, int],
    past: Past | None = None,
    spread: bool = True,
    deferred: Deferred | None = None,
) -> None:
    """Temp table ``_taken(step, ph, src, doc_id, piece, start, length, epoch, ord)``: the units each step
    draws, ``ph`` and ``src`` indices into ``spans`` and the sources by name.

    One source and one chunk of its draw order at a time (:func:`mixing.plan.draws.draw_source`): Python holds
    one chunk of documents and its units, never an array per document; DuckDB sorts the order and holds
    ``_taken``, and spills both past its ``memory_limit``. Also the temp view ``_plan_units``: ``_taken`` as
    ``plan_units``.
    """
    names = sorted(mix.sources)
    # what each step draws (step_quotas: step-major, sources by name): its quota less what it leaves to later phases
    quota = (quotas["quota"] - quotas["held"]).to_numpy().reshape(-1, len(names))
    if past is not None:  # the quotas start at the switch: the steps before it ask nothing
        quota = np.concatenate([np.zeros((past.at, len(names)), np.int64), quota])
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _taken (step BIGINT, ph SMALLINT, src SMALLINT, doc_id BIGINT, piece BIGINT, "
        "start BIGINT, length BIGINT, epoch INTEGER, ord BIGINT)"
    )
    starts = np.array([sp.first_step for sp in spans], np.int64)
    for i, s in enumerate(names):
        if not epochs[s]:
            continue
        segments = []
        for seg in length_segments(spans):
            col = quota[seg[0].first_step : seg[-1].end_step, i]
            pos = np.flatnonzero(col > 0)
            segments.append(SegmentQuota(seg[0].max_doc_tokens, seg[0].first_step + pos, 2 * np.cumsum(col)[pos]))
        (n_docs,) = con.sql("SELECT count(*) FROM documents WHERE source = ?", params=[s]).fetchall()[0]
        with SortedOrder(con, s, mix.seed) as order:
            pending: list[dict[str, np.ndarray]] = []
            trained = past.trained.get(s) if past is not None else None
            draws = draw_source(
                order,
                n_docs,
                seq=mix.sequence.length,
                epochs=epochs[s],
                segments=segments,
                trained=trained,
                spread=spread,
                deferred=(deferred or {}).get(s),
            )
            for u in draws:
                pending.append(u)
                if sum(len(p["step"]) for p in pending) >= _FLUSH_ROWS:
                    _insert(con, pending, i, starts)
            _insert(con, pending, i, starts)
    sources = ", ".join(f"'{n}'" for n in names)  # source names match [A-Za-z_][A-Za-z0-9_]*: safe to inline
    phases = ", ".join("'" + sp.name.replace("'", "''") + "'" for sp in spans)
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW _plan_units AS SELECT step, [{phases}][ph + 1] AS phase, "
        f"[{sources}][src + 1] AS source, doc_id, piece, start, length, epoch, ord FROM _taken "
        "ORDER BY step, src, ord"  # src follows name order: sorting ints is the cheap way to sort names
    )


_FLUSH_ROWS = 1 << 19  # units buffered before an INSERT: few statements for small plans, bounded for big ones


def _insert(con: duckdb.DuckDBPyConnection, pending: list[dict[str, np.ndarray]], src: int, starts: np.ndarray) -> None:
    """Append the ``pending`` chunks of source index ``src`` to ``_taken`` and empty the list (``starts``:
    each phase's first step, ascending: a step's phase is the last one starting at or before it)."""
    if not pending:
        return
    u = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
    pending.clear()
    n = len(u["step"])
    chunk = pa.table(
        {
            "step": u["step"],
            "ph": (np.searchsorted(starts, u["step"], side="right") - 1).astype(np.int16),
            "src": np.full(n, src, np.int16),
            **{k: u[k] for k in ("doc_id", "piece", "start", "length")},
            "epoch": u["epoch"].astype(np.int32),
            "ord": u["ord"],
        }
    )
    con.register("_chunk", chunk)
    con.execute("INSERT INTO _taken SELECT * FROM _chunk")
    con.unregister("_chunk")


def _summaries(
    con: duckdb.DuckDBPyConnection,
    mix: Mix,
    spans: tuple[PhaseSpan, ...],
    need: dict[tuple[str, str], int],
    have: dict[str, tuple[int, int]],
) -> tuple[pl.DataFrame, pl.DataFrame]:
    names = sorted(mix.sources)
    drawn = {
        names[r[0]]: (int(r[1]), int(r[2]))
        for r in con.sql("SELECT src, sum(length)::BIGINT, max(epoch) + 1 FROM _taken GROUP BY 1").fetchall()
    }
    per_source = pl.DataFrame(
        {
            "source": names,
            "tokens_planned": [sum(need[sp.name, s] for sp in spans) for s in names],
            "tokens_drawn": [drawn.get(s, (0, 0))[0] for s in names],
            "tokens_available": [have.get(s, (0, 0))[0] for s in names],
            "docs_available": [have.get(s, (0, 0))[1] for s in names],
            "epochs": [drawn.get(s, (0, 0))[0] / have[s][0] if have.get(s, (0, 0))[0] else 0.0 for s in names],
            "epochs_started": [drawn.get(s, (0, 0))[1] for s in names],
            "max_epochs": [float(mix.sources[s].max_epochs) for s in names],
        },
        schema_overrides={"tokens_planned": pl.Int64, "tokens_drawn": pl.Int64, "epochs_started": pl.Int64},
    )
    phases = pl.DataFrame(
        {
            "phase": [sp.name for sp in spans],
            "first_step": [sp.first_step for sp in spans],
            "steps": [sp.steps for sp in spans],
            "transition": [f"{sp.shape} {sp.ramp_steps}" if sp.ramp_steps else "step" for sp in spans],
            "max_doc_tokens": [sp.max_doc_tokens for sp in spans],
            "tokens_planned": [sum(need[sp.name, s] for s in names) for sp in spans],
            **{f"tokens_{s}": [need[sp.name, s] for sp in spans] for s in names},
        },
        schema_overrides={"max_doc_tokens": pl.Int64},
    )
    return per_source, phases
