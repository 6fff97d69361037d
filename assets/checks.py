"""Asset checks that stand beside the assets of a mix (those the asset bodies do not already emit).

Each check passes or fails with a one-line description, which the UI shows next to the asset.
"""

import warnings
from collections.abc import Mapping, Sequence

import dagster as dg

from assets.storage import WeirStorage
from mixing import Mix

__all__ = ["ingest_counts_check", "mix_checks"]


def _latest_metadata(context: dg.AssetCheckExecutionContext, key: dg.AssetKey, partition: str) -> Mapping:
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[partition]), limit=1
    ).records
    mat = records[0].asset_materialization if records else None
    return {k: v.value for k, v in mat.metadata.items()} if mat else {}


def ingest_counts_check(mix: Mix, documents: dg.AssetsDefinition) -> dg.AssetChecksDefinition:
    """``ingest_counts`` on ``[mix, documents]``, per source: records seen = kept + quarantined.

    Reads the counts from the partition's latest materialization (the one the same run just made), so a
    malformed record can never vanish between the reader and the table without this check failing. Links the
    source's ``quarantine.jsonl`` (the malformed records, with file, line and reason) when there is one.
    """

    # Partitioned checks are a "preview" feature of Dagster 1.13; the check needs one result per source.
    warnings.filterwarnings("ignore", category=dg.PreviewWarning, module="dagster")

    @dg.asset_check(
        asset=documents.key,
        name="ingest_counts",
        partitions_def=documents.partitions_def,
        description="Every record read is either kept or quarantined: docs_seen = docs_kept + docs_quarantined.",
    )
    def ingest_counts(context: dg.AssetCheckExecutionContext, storage: WeirStorage) -> dg.AssetCheckResult:
        source = context.partition_key
        quarantine = storage.layout(mix).source_dir(source) / "quarantine.jsonl"
        link = {"quarantine_file": dg.MetadataValue.path(str(quarantine))} if quarantine.exists() else {}
        meta = _latest_metadata(context, documents.key, source)
        if not {"docs_seen", "docs_kept", "docs_quarantined"} <= meta.keys():
            return dg.AssetCheckResult(passed=False, description=f"{source}: no ingest counts recorded yet")
        seen, kept, bad = (int(meta[k]) for k in ("docs_seen", "docs_kept", "docs_quarantined"))
        ok = seen == kept + bad
        return dg.AssetCheckResult(
            passed=ok,
            description=(
                f"{source}: {seen:,} seen = {kept:,} kept + {bad:,} quarantined"
                if ok
                else f"{source}: {seen:,} seen ≠ {kept:,} kept + {bad:,} quarantined ({seen - kept - bad:+,} lost)"
            ),
            metadata={"docs_seen": seen, "docs_kept": kept, "docs_quarantined": bad, **link},
        )

    return ingest_counts


def mix_checks(mix: Mix, assets: Sequence[dg.AssetsDefinition]) -> list[dg.AssetChecksDefinition]:
    """The checks of :mod:`assets.checks` for ``mix`` whose key no asset body already declares."""
    by_stage = {k.path[-1]: a for a in assets for k in a.keys}
    declared = {ck for a in assets for ck in a.check_keys}
    candidates = [ingest_counts_check(mix, by_stage["documents"])]
    return [c for c in candidates if not set(c.check_keys) & declared]
