"""``pipelines/relay.py``: what a stage's throwaway run recorded, relayed into the build's run. Materializations
and check evaluations come field for field, log lines of ``INFO`` and above go to the op's log; the code version
names the build's run, and an input's pointer names its latest materialization in the build's instance (or goes,
with its data version, where there is none), so that a whole build leaves no stage unsynced; the runs recorded
before a stage's (in the one throwaway instance of a build) are not relayed again."""

# No `from __future__ import annotations` here: Dagster reads the asset's context annotation as a class.
import logging
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import dagster as dg

from assets import WeirEngine, WeirStorage, mix_assets
from mixing import load_mix, stages
from pipelines.build import build_mix
from pipelines.relay import provenance, recorded

POINTER, INPUT_VERSION = "dagster/input_event_pointer/", "dagster/input_data_version/"


@dg.asset(code_version="1")
def up() -> int:
    return 1


@dg.asset(code_version="1", check_specs=[dg.AssetCheckSpec("fits", asset="down", blocking=True)])
def down(context: dg.AssetExecutionContext, up: int) -> Iterator[dg.Output[int] | dg.AssetCheckResult]:
    context.log.info("said at info")
    context.log.debug("said at debug")
    yield dg.Output(up + 1, metadata={"n": up + 1})
    yield dg.AssetCheckResult(check_name="fits", passed=False, description="it does not fit")


def op_context(instance: dg.DagsterInstance, logs: list[tuple[int, str]]) -> Any:
    """The part of an op's context that :func:`recorded` reads: its run, its instance, its log."""
    log = SimpleNamespace(log=lambda level, message: logs.append((level, message)))
    return cast(Any, SimpleNamespace(run_id="the-build-run", instance=instance, log=log))


def test_what_the_throwaway_run_recorded_is_relayed_with_the_build_instance_provenance() -> None:
    inner, outer = dg.DagsterInstance.ephemeral(), dg.DagsterInstance.ephemeral()
    dg.materialize([up, down], instance=inner, raise_on_error=False)
    dg.materialize([up], instance=outer)
    theirs = outer.fetch_materializations(dg.AssetKey("up"), limit=1).records[0]
    logs: list[tuple[int, str]] = []

    events = list(recorded(inner, op_context(outer, logs)))

    materializations = [e for e in events if isinstance(e, dg.AssetMaterialization)]
    checks = [e for e in events if isinstance(e, dg.AssetCheckEvaluation)]
    assert events == [*materializations, *checks] and (len(materializations), len(checks)) == (2, 1)
    (m_up, m_down), (check,) = materializations, checks
    assert (m_up.asset_key, m_down.asset_key) == (dg.AssetKey("up"), dg.AssetKey("down"))
    assert m_down.metadata["n"] == dg.IntMetadataValue(2)
    assert [(m.tags or {}).get("dagster/code_version") for m in materializations] == ["the-build-run"] * 2
    assert m_down.tags is not None and m_down.tags[f"{POINTER}up"] == str(theirs.storage_id)
    assert m_down.tags[f"{INPUT_VERSION}up"] == (theirs.event_log_entry.tags or {})["dagster/data_version"]
    assert (check.check_name, check.passed, check.blocking, check.description) == (
        "fits",
        False,
        True,
        "it does not fit",
    )
    assert (logging.INFO, "said at info") in logs and not any(m == "said at debug" for _l, m in logs)


def test_the_runs_recorded_before_are_skipped() -> None:
    # one throwaway instance serves every stage of a build: each stage relays its own run only
    inner, outer = dg.DagsterInstance.ephemeral(), dg.DagsterInstance.ephemeral()
    dg.materialize([up], instance=inner)
    before = {run.run_id for run in inner.get_runs()}
    dg.materialize([up, down], selection=[down], instance=inner, raise_on_error=False)
    keys = [e.asset_key for e in recorded(inner, op_context(outer, []), skip=before)]
    assert keys == [dg.AssetKey("down"), dg.AssetKey("down")], keys  # its materialization and its check
    assert len(list(recorded(inner, op_context(outer, [])))) == 3


def test_an_input_the_build_instance_never_materialized_loses_its_pointer_and_version() -> None:
    outer = dg.DagsterInstance.ephemeral()
    tags = {"dagster/data_version": "v", f"{POINTER}up": "12", f"{INPUT_VERSION}up": "u"}
    assert provenance(dict(tags), op_context(outer, [])) == {"dagster/data_version": "v"}
    assert provenance({}, op_context(outer, [])) == {}, "no code version is added where there was none"


def test_a_whole_build_leaves_no_stage_unsynced(tiny_mix_path: Path, tmp_path: Path) -> None:
    # What the UI shows as "Unsynced" (Dagster's stale status, computed by the resolver its GraphQL uses): each
    # stage's recorded inputs must be the materializations of the same run, not the throwaway instance's.
    from dagster._core.definitions.data_version import CachingStaleStatusResolver, StaleStatus
    from dagster._core.loader import LoadingContextForTest

    mix = load_mix(tiny_mix_path)
    instance = dg.DagsterInstance.ephemeral()
    build_mix(mix, tmp_path / "out", say=lambda _s: None, instance=instance)
    resources = {"storage": WeirStorage(root=str(tmp_path)), "engine": WeirEngine()}
    graph = dg.Definitions(assets=mix_assets(mix), resources=resources).get_repository_def().asset_graph
    resolver = CachingStaleStatusResolver(instance, graph, LoadingContextForTest(instance))
    for stage in stages.STAGES:
        key = dg.AssetKey([mix.name, stage.name])
        for partition in stage.partitions(mix):
            assert resolver.get_status(key, partition) == StaleStatus.FRESH, (
                stage.name,
                partition,
                [c.reason for c in resolver.get_stale_causes(key, partition)],
            )
