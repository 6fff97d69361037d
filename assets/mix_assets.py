"""Dagster assets of one mix, one per stage of :data:`mixing.stages.STAGES`.

Every asset calls one function of :mod:`mixing.stages` and returns its summary as metadata and checks. Its
key (``[<mix name>, <stage>]``), partitioning (per-source stages by source name) and deps come from the
stage table; the group is the mix name.
"""

import logging
from collections.abc import Callable, Sequence

import dagster as dg
import polars as pl
from dagster import AssetExecutionContext

from assets.checks import (
    check_specs,
    continuation,
    float_value,
    int_value,
    mixture_check,
    stream_check,
)
from assets.engine import WeirEngine
from assets.plots import length_histogram_md, mixture_area_md
from assets.storage import WeirStorage
from mixing import Mix, stages
from mixing.ingest.records import chat_markers_warning
from mixing.ingest.tokenizer import TextTokenizer, load_tokenizer
from mixing.report import MIN_PACKING_EFFICIENCY, inspect_build, write_report

__all__ = ["mix_assets"]

_LOG = logging.getLogger("weir.documents")  # `weir build` prints this logger's warnings


def _pieces(tok: TextTokenizer) -> Callable[[str], int]:
    """How many tokens ``tok`` makes of a text, BOS/EOS not counted."""
    extra = len(tok.encode_batch([""])[0])
    return lambda text: len(tok.encode_batch([text])[0]) - extra


def _base_options(mix: Mix, storage: WeirStorage) -> dict[str, object] | None:
    """The resource's fsspec options when a continuation's base is in an object store."""
    base = mix.continues.base if mix.continues is not None else ""
    return storage.storage_options() if "://" in base and not base.startswith("file://") else None


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
                check_specs=check_specs(key(stage), checks or {}),
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
                "files": int_value(len(df) - len(skipped)),
                "bytes": int_value(df["size"].sum()),
                "skipped": int_value(len(skipped)),
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
                "vocab_size": int_value(tok.vocab_size),
                "eos_id": int_value(tok.eos_id),
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
                "docs_seen": int_value(r.docs_seen),
                "docs_kept": int_value(r.docs_kept),
                "docs_quarantined": int_value(r.docs_quarantined),
                "tokens": int_value(r.tokens),
                "bytes": int_value(r.bytes_in),
                "quarantine_reasons": r.quarantine_reasons,
                "quarantine": dg.MetadataValue.path(f"{layout.url}/sources/{name}/quarantine.jsonl"),
                "quarantine_sample": dg.MetadataValue.json(r.quarantine_sample),
                "tokenizer_fingerprint": r.tokenizer,
                "chunks": int_value(r.chunks),
                "chunks_reused": int_value(r.chunks_reused),
                "chunks_damaged": int_value(len(r.chunks_damaged)),
                "warnings": dg.MetadataValue.md("\n".join(f"- {w}" for w in warnings) or "none"),
                "mb_per_s": float_value(round(r.bytes_in / 1e6 / max(r.seconds, 1e-9), 2)),
                "engine": r.engine,
                "workers": int_value(r.workers),
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
                "documents": int_value(overall["docs"][0]),
                "tokens": int_value(overall["tokens"][0]),
                "share_over_seq": float_value(overall["share_over_seq"][0]),
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
                "steps": int_value(mix.total_steps),
                "units": int_value(p.units),
                "fit_plans": int_value(p.plans),
                "documents_deferred": int_value(p.deferred),
                "tokens_held": int_value(p.quotas["held"].sum()),
                "mixture": dg.MetadataValue.md(mixture_area_md(p.quotas)),
                "phases": dg.MetadataValue.md(_markdown(p.phases)),
                "per_source": dg.MetadataValue.md(_markdown(p.per_source)),
                "warnings": dg.MetadataValue.md("\n".join(f"- {w}" for w in p.warnings) or "none"),
                "mixture_error_window": float_value(me.window),
                "mixture_error_phase": float_value(me.phase),
                **stages.fingerprints(mix, layout),
            },
            check_results=[
                mixture_check(me.window, me.phase, "planned", (me.unit_window, me.unit_phase), "document"),
                dg.AssetCheckResult(
                    check_name="planned_documents_exist",
                    passed=audit.missing_units == 0 and audit.duplicate_units == 0,
                    description=f"{audit.missing_units} planned units missing, "
                    f"{audit.duplicate_units} drawn twice within an epoch (goal 0 and 0)",
                    metadata={
                        "missing": int_value(audit.missing_units),
                        "duplicates": int_value(audit.duplicate_units),
                    },
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
        continued, prefix_check = continuation(mix, layout, _base_options(mix, storage))
        return dg.MaterializeResult(
            metadata={
                "path": dg.MetadataValue.path(layout.shards_url),
                "sequences": int_value(r.sequences),
                "tokens": int_value(r.tokens),
                "tokens_dropped": int_value(r.tokens_dropped),
                "packing_efficiency": float_value(eff),
                "truncated_docs": float_value(trunc),
                "mixture_error_window": float_value(me.window),
                "mixture_error_phase": float_value(me.phase),
                # the balance the build sees without a world: its sequences' cost spread, the dp_imbalance of
                # one sequence per DP rank a step (the loader's sampler evens it out further)
                "sequence_cost_max_over_mean": float_value(r.sequence_cost.max_over_mean),
                "sequence_cost_p95_over_mean": float_value(r.sequence_cost.p95_over_mean),
                **(
                    {  # what the trainer receives, where the mix file regroups steps (else: the build's steps)
                        "stream_mixture_error_window": float_value(r.mixture_error_stream.window),
                        "stream_mixture_error_phase": float_value(r.mixture_error_stream.phase),
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
                    metadata={"value": float_value(eff)},
                ),
                dg.AssetCheckResult(
                    check_name="truncated_docs",
                    passed=trunc == 0,
                    description=f"{trunc:.4f} of documents ≤ S were split (goal 0)",
                    metadata={"value": float_value(trunc)},
                ),
                dg.AssetCheckResult(
                    check_name="manifest_checksums",
                    passed=not bad,
                    description="all shard checksums match" if not bad else f"corrupt: {', '.join(bad)}",
                ),
                stream_check(layout, me),
            ],
        )

    if missing := sorted(table.keys() - made.keys()):
        raise LookupError(f"stages of mixing.stages.STAGES without an asset: {missing}")
    return [made[s.name] for s in stages.STAGES]
