"""What a stage's throwaway run recorded, relayed into the build's run.

A build's op materializes its stage's asset as Dagster does it, in a throwaway instance (:mod:`pipelines.build`);
:func:`recorded` then reads what the runs there recorded and gives it to the op to report in the build's run: each
materialization (its key, partition, metadata, description) and each check evaluation, field for field, in the
order recorded, and the log lines (``INFO`` and above) passed to the op's log. A check's target materialization,
which points into the throwaway instance, is left out. The materializations' provenance tags are rewritten for the
build's instance (:func:`provenance`), so that Dagster does not show every stage unsynced.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator

import dagster as dg
from dagster import OpExecutionContext

__all__ = ["provenance", "recorded"]


_POINTER = "dagster/input_event_pointer/"
_INPUT_VERSION = "dagster/input_data_version/"


def provenance(tags: dict[str, str], context: OpExecutionContext) -> dict[str, str]:
    """A materialization's tags from the throwaway instance, made true in the build's: the code version names the
    build's run, and each input's event pointer and data version (of the throwaway instance, where the input was
    never materialized) those of the input's latest materialization in the build's instance, which is what the
    stage read (the ops before it reported it there). Otherwise Dagster shows every stage unsynced."""
    if "dagster/code_version" in tags:
        tags["dagster/code_version"] = context.run_id
    for key in [k for k in tags if k.startswith(_POINTER)]:
        name = key.removeprefix(_POINTER)
        upstream = dg.AssetKey.from_user_string(name)
        latest = context.instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=upstream), limit=1).records
        version = (latest[0].event_log_entry.tags or {}).get("dagster/data_version") if latest else None
        if latest and version:
            tags[key] = str(latest[0].storage_id)
            tags[f"{_INPUT_VERSION}{name}"] = version
        else:
            tags.pop(key)
            tags.pop(f"{_INPUT_VERSION}{name}", None)
    return tags


def recorded(
    inner: dg.DagsterInstance, context: OpExecutionContext, skip: Collection[str] = ()
) -> Iterator[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """What the runs in ``inner`` recorded (but those whose ids are in ``skip``, recorded before): their
    materializations and check evaluations, to report in ``context``'s run, and their log lines, passed to
    ``context``'s log. A check's target materialization, which points into ``inner``, is left out (a check and its
    materialization in one run go together anyway); the materializations' provenance is rewritten for the build's
    instance (:func:`provenance`)."""
    for run in inner.get_runs():
        if run.run_id in skip:
            continue
        for entry in inner.all_logs(run.run_id):
            event = entry.dagster_event
            if event is None:
                level = entry.level if isinstance(entry.level, int) else logging.INFO
                if entry.user_message and level >= logging.INFO:
                    context.log.log(level, entry.user_message)
            elif event.event_type == dg.DagsterEventType.ASSET_MATERIALIZATION:
                m = event.step_materialization_data.materialization
                tags = provenance(dict(m.tags or {}), context)
                yield dg.AssetMaterialization(
                    asset_key=m.asset_key,
                    partition=m.partition,
                    metadata=m.metadata,
                    tags=tags,
                    description=m.description,
                )
            elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
                c = event.event_specific_data
                assert isinstance(c, dg.AssetCheckEvaluation)
                yield dg.AssetCheckEvaluation(
                    asset_key=c.asset_key,
                    check_name=c.check_name,
                    passed=c.passed,
                    metadata=c.metadata,
                    severity=c.severity,
                    description=c.description,
                    blocking=c.blocking,
                    partition=c.partition,
                )
