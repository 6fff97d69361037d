"""Dagster assets of one mix, one per stage of :data:`mixing.stages.STAGES`.

Every asset calls one function of :mod:`mixing.stages` and returns its summary as metadata and checks. Its
key (``[<mix name>, <stage>]``), partitioning (per-source stages by source name) and deps come from the
stage table; the group is the mix name.
"""

import logging
from collections.abc import Callable, Sequence
from typing import Any

import dagster as dg
import polars as pl
from dagster import AssetExecutionContext

from assets.engine import WeirEngine
from assets.plots import length_histogram_md, mixture_area_md
from assets.storage import WeirStorage
from mixing import BuildLayout, Mix, stages
from mixing.continuation import Base
from mixing.ingest.records import chat_markers_warning
from mixing.ingest.tokenizer import TextTokenizer, load_tokenizer
from mixing.plan.mixture import GOAL_PHASE, GOAL_WINDOW, MixtureReport, goal_text, unit_goal
from mixing.report import inspect_build, write_report

__all__ = ["BLOCKING_CHECKS", "MIN_PACKING_EFFICIENCY", "mix_assets"]

MIN_PACKING_EFFICIENCY = 0.995  # docs/design.md goal
BLOCKING_CHECKS = frozenset(
    {"planned_documents_exist", "token_budget_per_phase", "manifest_checksums", "prefix_unchanged"}
)
"""Checks whose failure stops what follows (``blocking``): a stage after a plan that draws missing pieces or runs
short, or after shards that do not match their manifest or a continuation's base, would build on a wrong
result. The goals (``mixture_error``, ``packing_efficiency``: WARN) and the rest report without stopping."""
_LOG = logging.getLogger("weir.documents")  # `weir build` prints this logger's warnings


def _pieces(tok: TextTokenizer) -> Callable[[str], int]:
    """How many tokens ``tok`` makes of a text, BOS/EOS not counted."""
    extra = len(tok.encode_batch([""])[0])
    return lambda text: len(tok.encode_batch([text])[0]) - extra


def _int(value: Any) -> dg.IntMetadataValue:
    """A count as Dagster's int metadata (numpy's integers are not ``int``: they would be stored as text)."""
    return dg.MetadataValue.int(int(value))


def _float(value: Any) -> dg.FloatMetadataValue:
    """A figure as Dagster's float metadata, which the asset's *Plots* tab draws across materializations."""
    return dg.MetadataValue.float(float(value))


def _markdown(df: pl.DataFrame) -> str:
    """A polars frame as a markdown table (floats to 4 decimals) for Dagster metadata."""

    def cell(v: object) -> str:
        return f"{v:.4f}" if isinstance(v, float) else str(v)

    head = "| " + " | ".join(df.columns) + " |\n|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.iter_rows()]
    return "\n".join([head, *rows])


def _s3(mix: Mix, storage: WeirStorage) -> dict[str, object] | None:
    """The resource's fsspec options, only for mixes that read from a remote store."""
    remote = any("://" in mix.source_uri(n) and not mix.source_uri(n).startswith("file://") for n in mix.sources)
    return storage.storage_options() if remote else None


def _base_options(mix: Mix, storage: WeirStorage) -> dict[str, object] | None:
    """The resource's fsspec options when a continuation's base is in an object store."""
    base = mix.continues.base if mix.continues is not None else ""
    return storage.storage_options() if "://" in base and not base.startswith("file://") else None


def _continuation(mix: Mix, layout: BuildLayout, storage: WeirStorage) -> tuple[dict[str, Any], list[Any]]:
    """A continuation's metadata (its base, the switch step, the lineage) and its ``prefix_unchanged`` check;
    nothing for a build of its own."""
    if mix.continues is None:
        return {}, []
    base = Base(mix.continues.base, mix.continues.at, _base_options(mix, storage))
    problems = base.prefix_problems(layout.shard_set())
    at = mix.continues.at
    meta = {
        "continues": dg.MetadataValue.path(mix.continues.base),
        "continues_build_id": base.build_id,
        "switch_step": _int(at),
        "lineage": dg.MetadataValue.md(
            "\n".join(f"- {e.base[:12]}… → this build at step {e.at} (base mix {e.base_mix})" for e in base.lineage())
        ),
    }
    check = dg.AssetCheckResult(
        check_name="prefix_unchanged",
        passed=not problems,
        description=f"steps 0..{at - 1} identical to the base ({at} digests, the base's shard files)"
        if not problems
        else "; ".join(problems),
        metadata={"switch_step": _int(at)},
    )
    return meta, [check]


def _check_specs(asset: dg.AssetKey, described: dict[str, str]) -> list[dg.AssetCheckSpec]:
    """One check spec per ``name: description`` on ``asset``, blocking when named in :data:`BLOCKING_CHECKS`."""
    return [
        dg.AssetCheckSpec(name, asset=asset, description=text, blocking=name in BLOCKING_CHECKS)
        for name, text in described.items()
    ]


def _mixture_check(
    window: float, phase: float, what: str, units: tuple[float, float], unit: str = "sequence"
) -> dg.AssetCheckResult:
    """The ``mixture_error`` check (WARN) against docs/design.md's goals, with both figures in its one line;
    where one whole ``unit`` (sequence, or the plan's document) is a larger share of a window or of the
    smallest phase (``units``, see :func:`mixing.plan.mixture.unit_goal`), the goal is that share, and the
    line says so."""
    goal_w, goal_p = unit_goal(GOAL_WINDOW, units[0]), unit_goal(GOAL_PHASE, units[1])
    return dg.AssetCheckResult(
        check_name="mixture_error",
        passed=bool(window <= goal_w and phase <= goal_p),
        severity=dg.AssetCheckSeverity.WARN,
        description=f"{what}: window {window:.4f} (goal {goal_text(GOAL_WINDOW, units[0], window, 'a window', unit)}), "
        f"phase {phase:.4f} (goal {goal_text(GOAL_PHASE, units[1], phase, 'the smallest phase', unit)})",
        metadata={
            "window": _float(window),
            "phase": _float(phase),
            "goal_window": _float(goal_w),
            "goal_phase": _float(goal_p),
        },
    )


def _stream_check(root: BuildLayout, built: MixtureReport) -> dg.AssetCheckResult:
    """The ``mixture_error`` check of the build's steps and, when the mix file regroups them, of the stream
    the trainer receives (:func:`assets.stream.stream_report`): the worse of the two is judged."""
    regroup = root.shard_set().manifest.regrouping
    if regroup.window <= 1:
        return _mixture_check(
            built.window, built.phase, "realized after packing", (built.unit_window, built.unit_phase)
        )
    from assets.stream import stream_report

    st = stream_report(root)
    return _mixture_check(
        max(built.window, st.window),
        max(built.phase, st.phase),
        f"build's steps {built.window:.4f} / {built.phase:.4f}; trainer's stream (regroup window "
        f"{regroup.window}, period {regroup.period})",
        (max(built.unit_window, st.unit_window), max(built.unit_phase, st.unit_phase)),
    )


def mix_assets(mix: Mix) -> Sequence[dg.AssetsDefinition]:
    """The assets of ``mix``, one per stage of :data:`mixing.stages.STAGES` and in its order (keys
    ``[mix.name, stage]``). Raises ``LookupError`` for a stage of the table with no asset defined here."""
    table = {s.name: s for s in stages.STAGES}
    parts = dg.StaticPartitionsDefinition(sorted(mix.sources))
    made: dict[str, dg.AssetsDefinition] = {}

    def key(stage: str) -> dg.AssetKey:
        return dg.AssetKey([mix.name, stage])

    def asset(
        stage: str, kinds: set[str], description: str, checks: dict[str, str] | None = None
    ) -> Callable[[Callable[..., dg.MaterializeResult]], dg.AssetsDefinition]:
        """``dg.asset`` for ``stage``: key, partitions and deps from its row of the table; ``checks`` as
        ``name: description``. Records the asset for :func:`mix_assets`' result."""
        row = table[stage]

        def define(body: Callable[..., dg.MaterializeResult]) -> dg.AssetsDefinition:
            made[stage] = dg.asset(
                key=key(stage),
                group_name=mix.name,
                partitions_def=parts if row.per_source else None,
                deps=[key(d) for d in row.deps],
                kinds=kinds,
                description=description,
                check_specs=_check_specs(key(stage), checks or {}),
            )(body)
            return made[stage]

        return define

    @asset(
        "source_index",
        kinds={"fsspec"},
        description="Files of one source with their fingerprints.",
    )
    def source_index(context: AssetExecutionContext, storage: WeirStorage) -> dg.MaterializeResult:
        df = stages.index(mix, storage.layout(mix), context.partition_key, _s3(mix, storage))
        skipped = df.filter(pl.col("skipped").is_not_null())  # matched, not read: quarantined by documents
        listed = [{"path": p, "reason": r} for p, r in skipped.head(100).select("path", "skipped").iter_rows()]
        return dg.MaterializeResult(
            metadata={
                "files": _int(len(df) - len(skipped)),
                "bytes": _int(df["size"].sum()),
                "skipped": _int(len(skipped)),
                "skipped_paths": dg.MetadataValue.json(listed),  # the first 100 (all are in quarantine.jsonl)
            }
        )

    @asset(
        "tokenizer",
        kinds={"tokenizers"},
        description="The mix's tokenizer (a byte-level BPE trained on the sources by default).",
    )
    def tokenizer(context: AssetExecutionContext, storage: WeirStorage) -> dg.MaterializeResult:
        tok = stages.prepare_tokenizer(mix, storage.layout(mix), _s3(mix, storage))
        return dg.MaterializeResult(
            metadata={
                "kind": mix.tokenizer.kind,
                "vocab_size": _int(tok.vocab_size),
                "eos_id": _int(tok.eos_id),
                "fingerprint": tok.fingerprint,
            }
        )

    @asset(
        "documents",
        kinds={"parquet"},
        description="Tokenized documents of one source; malformed records are quarantined.",
        checks={
            "docs_accounted": "Every record read is kept or quarantined: docs_seen = docs_kept + docs_quarantined.",
        },
    )
    def documents(context: AssetExecutionContext, storage: WeirStorage, engine: WeirEngine) -> dg.MaterializeResult:
        layout = storage.layout(mix)
        name = context.partition_key
        chat = chat_markers_warning(
            name, mix.sources[name], _pieces(load_tokenizer(mix.tokenizer, layout.tokenizer_dir))
        )
        if chat:
            _LOG.warning(chat)
            context.log.warning(chat)
        r = stages.tokenize(mix, layout, name, context.log.info, _s3(mix, storage), engine.engine())
        accounted = r.docs_seen == r.docs_kept + r.docs_quarantined
        warnings = [*([chat] if chat else []), *r.warnings]
        return dg.MaterializeResult(
            metadata={
                "docs_seen": _int(r.docs_seen),
                "docs_kept": _int(r.docs_kept),
                "docs_quarantined": _int(r.docs_quarantined),
                "tokens": _int(r.tokens),
                "bytes": _int(r.bytes_in),
                "quarantine_reasons": r.quarantine_reasons,
                "quarantine": dg.MetadataValue.path(f"{layout.url}/sources/{name}/quarantine.jsonl"),
                "quarantine_sample": dg.MetadataValue.json(r.quarantine_sample),
                "tokenizer_fingerprint": r.tokenizer,
                "chunks": _int(r.chunks),
                "chunks_reused": _int(r.chunks_reused),
                "chunks_damaged": _int(len(r.chunks_damaged)),
                "warnings": dg.MetadataValue.md("\n".join(f"- {w}" for w in warnings) or "none"),
                "mb_per_s": _float(round(r.bytes_in / 1e6 / max(r.seconds, 1e-9), 2)),
                "engine": r.engine,
                "workers": _int(r.workers),
            },
            check_results=[
                dg.AssetCheckResult(
                    check_name="docs_accounted",
                    passed=accounted,
                    description=f"docs seen {r.docs_seen} = kept {r.docs_kept} + quarantined {r.docs_quarantined}"
                    if accounted
                    else f"docs seen {r.docs_seen} != kept {r.docs_kept} + quarantined {r.docs_quarantined}",
                )
            ],
        )

    @asset(
        "length_stats",
        kinds={"duckdb"},
        description="Per-source length summary and log2 histogram, in the build's DuckDB file.",
    )
    def length_stats(context: AssetExecutionContext, storage: WeirStorage) -> dg.MaterializeResult:
        st = stages.length_stats(mix, storage.layout(mix))
        overall = st.summary.filter(source="*")
        return dg.MaterializeResult(
            metadata={
                "histogram": dg.MetadataValue.md(length_histogram_md(st.histogram, mix.sequence.length)),
                "summary": dg.MetadataValue.md(_markdown(st.summary)),
                "documents": _int(overall["docs"][0]),
                "tokens": _int(overall["tokens"][0]),
                "share_over_seq": _float(overall["share_over_seq"][0]),
            }
        )

    @asset(
        "plan",
        kinds={"duckdb"},
        description="Per-step token quotas per source and the documents each step draws.",
        checks={
            "mixture_error": "Planned shares vs the curriculum: ≤ 0.01 per 10 steps, ≤ 0.002 per phase (WARN).",
            "planned_documents_exist": "Every planned piece exists; none is drawn twice in an epoch of its source.",
            "token_budget_per_phase": "Each phase draws the tokens its steps need.",
        },
    )
    def plan(context: AssetExecutionContext, storage: WeirStorage) -> dg.MaterializeResult:
        layout = storage.layout(mix)
        p = stages.plan(mix, layout, storage_options=_base_options(mix, storage))
        audit = stages.plan_audit(mix, layout)
        me = audit.mixture
        short = audit.budget.filter(pl.col("short") > 0)
        return dg.MaterializeResult(
            metadata={
                "steps": _int(mix.total_steps),
                "units": _int(p.units),
                "mixture": dg.MetadataValue.md(mixture_area_md(p.quotas)),
                "phases": dg.MetadataValue.md(_markdown(p.phases)),
                "per_source": dg.MetadataValue.md(_markdown(p.per_source)),
                "warnings": dg.MetadataValue.md("\n".join(f"- {w}" for w in p.warnings) or "none"),
                "mixture_error_window": _float(me.window),
                "mixture_error_phase": _float(me.phase),
                **stages.fingerprints(mix, layout),
            },
            check_results=[
                _mixture_check(me.window, me.phase, "planned", (me.unit_window, me.unit_phase), "document"),
                dg.AssetCheckResult(
                    check_name="planned_documents_exist",
                    passed=audit.missing_units == 0 and audit.duplicate_units == 0,
                    description=f"{audit.missing_units} planned units missing, "
                    f"{audit.duplicate_units} drawn twice within an epoch (goal 0 and 0)",
                    metadata={"missing": _int(audit.missing_units), "duplicates": _int(audit.duplicate_units)},
                ),
                dg.AssetCheckResult(
                    check_name="token_budget_per_phase",
                    passed=audit.budget_met,
                    description="every phase draws its planned tokens of every source"
                    if audit.budget_met
                    else "short: " + ", ".join(f"{r[0]}/{r[1]} by {r[4]}" for r in short.iter_rows()),
                    metadata={"budget": dg.MetadataValue.md(_markdown(audit.budget))},
                ),
            ],
        )

    @asset(
        "packed_shards",
        kinds={"numpy"},
        description="Packed fixed-length sequences with document boundaries, as checksummed shards.",
        checks={
            "packing_efficiency": "Real tokens ÷ (sequences × S) ≥ 0.995 (WARN).",
            "truncated_docs": "No document of length ≤ S is split across sequences.",
            "manifest_checksums": "Every shard file's size and sha256 match the manifest.",
            "mixture_error": "Realized shares in the shards: ≤ 0.01 per 10 steps, ≤ 0.002 per phase (WARN).",
            **(
                {"prefix_unchanged": "A continuation: its steps before the switch are its base's, digest for digest."}
                if mix.continues is not None
                else {}
            ),
        },
    )
    def packed_shards(context: AssetExecutionContext, storage: WeirStorage, engine: WeirEngine) -> dg.MaterializeResult:
        layout = storage.layout(mix)
        stages.pack(mix, layout, engine=engine.engine(), storage_options=_base_options(mix, storage))
        r = inspect_build(layout)  # hashes every shard (in threads) once; the CLI reads the saved figures
        write_report(layout, r)
        eff, trunc, bad, me = r.packing_efficiency, r.truncated_docs, r.corrupt_files, r.mixture_error
        continued, prefix_check = _continuation(mix, layout, storage)
        return dg.MaterializeResult(
            metadata={
                "path": dg.MetadataValue.path(layout.shards_url),
                "sequences": _int(r.sequences),
                "tokens": _int(r.tokens),
                "tokens_dropped": _int(r.tokens_dropped),
                "packing_efficiency": _float(eff),
                "truncated_docs": _float(trunc),
                "mixture_error_window": _float(me.window),
                "mixture_error_phase": _float(me.phase),
                # the balance the build sees without a world: its sequences' cost spread, the dp_imbalance of
                # one sequence per DP rank a step (the loader's sampler evens it out further)
                "sequence_cost_max_over_mean": _float(r.sequence_cost.max_over_mean),
                "sequence_cost_p95_over_mean": _float(r.sequence_cost.p95_over_mean),
                **(
                    {  # what the trainer receives, where the mix file regroups steps (else: the build's steps)
                        "stream_mixture_error_window": _float(r.mixture_error_stream.window),
                        "stream_mixture_error_phase": _float(r.mixture_error_stream.phase),
                    }
                    if r.mixture_error_stream is not None
                    else {}
                ),
                **stages.fingerprints(mix, layout),
                **continued,
            },
            check_results=[
                *prefix_check,
                dg.AssetCheckResult(
                    check_name="packing_efficiency",
                    passed=eff >= MIN_PACKING_EFFICIENCY,
                    severity=dg.AssetCheckSeverity.WARN,
                    description=f"{eff:.4f} (goal ≥ {MIN_PACKING_EFFICIENCY})",
                    metadata={"value": _float(eff)},
                ),
                dg.AssetCheckResult(
                    check_name="truncated_docs",
                    passed=trunc == 0,
                    description=f"{trunc:.4f} of documents ≤ S were split (goal 0)",
                    metadata={"value": _float(trunc)},
                ),
                dg.AssetCheckResult(
                    check_name="manifest_checksums",
                    passed=not bad,
                    description="all shard checksums match" if not bad else f"corrupt: {', '.join(bad)}",
                ),
                _stream_check(layout, me),
            ],
        )

    if missing := sorted(table.keys() - made.keys()):
        raise LookupError(f"stages of mixing.stages.STAGES without an asset: {missing}")
    return [made[s.name] for s in stages.STAGES]
