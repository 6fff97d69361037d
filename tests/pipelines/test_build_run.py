"""A build is one Dagster run, and the UI's automation knows a build's runs from its own (no daemon here: the
conditions are evaluated as the daemon would, :func:`dagster.evaluate_automation_conditions`).

- ``weir build``'s run tags: the output, and whether it is the mix's own folder;
- the checks that stop what follows are blocking, the goals are not;
- a failed blocking check stops the build's run there, and no asset is marked failed by it;
- automation takes no news from a whole build nor anything from a build elsewhere, waits while the output's
  lock is held, and builds nothing after a failed blocking check upstream;
- a build into the mix's own folder stops (or waits) while a Dagster run writes that folder.

With a real daemon and ``weir ui``: ``test_ui_automation.py``.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import dagster as dg
import pytest

from assets import WeirEngine, WeirStorage, mix_assets
from mixing import Mix, load_mix, stages
from mixing.stages import Stage
from pipelines import build
from pipelines.build import BUILD_TAG, ELSEWHERE_TAG, OUT_TAG, BlockingCheckFailed, build_job, build_tags, ui_output
from pipelines.definitions import load_definitions
from pipelines.output_lock import dagster_writers, output_lock
from pipelines.transaction import BuildBusy, build_output

EXPECTED_BLOCKING = {
    ("plan", "planned_documents_exist"),
    ("plan", "token_budget_per_phase"),
    ("packed_shards", "manifest_checksums"),
}


def test_a_cli_build_says_where_it_built_and_whether_that_is_the_mix_own_folder(tiny_mix_path: Path) -> None:
    mix = load_mix(tiny_mix_path)
    root = tiny_mix_path.parent / "root"
    own = ui_output(mix, root)
    assert own == (root / "tiny").resolve()
    assert build_tags(mix, own, root) == {BUILD_TAG: "cli", OUT_TAG: str(own)}
    assert build_tags(mix, f"file://{own}", root) == {BUILD_TAG: "cli", OUT_TAG: f"file://{own}"}
    assert build_tags(mix, root / "elsewhere", root)[ELSEWHERE_TAG] == "true"
    remote = build_tags(mix, "s3://KEY:SECRET@bucket/tiny", "s3://KEY:SECRET@bucket")
    assert ELSEWHERE_TAG not in remote and "SECRET" not in remote[OUT_TAG]
    assert build_tags(mix, "s3://bucket/other", "s3://bucket")[ELSEWHERE_TAG] == "true"


def test_the_checks_that_stop_what_follows_are_blocking_and_the_goals_are_not(tiny_mix_path: Path) -> None:
    mix = load_mix(tiny_mix_path)
    found = {(a.key.path[-1], s.name): s.blocking for a in mix_assets(mix) for s in a.check_specs}
    assert {k for k, blocking in found.items() if blocking} == EXPECTED_BLOCKING
    assert not found[("plan", "mixture_error")] and not found[("packed_shards", "packing_efficiency")]
    continued = mix.continuing(str(tiny_mix_path.parent / "base"), 2)  # a continuation's prefix check too
    specs = {s.name: s.blocking for a in mix_assets(continued) for s in a.check_specs}
    assert specs["prefix_unchanged"] is True


def _two_stages(monkeypatch: pytest.MonkeyPatch, mix: Mix, passed: bool) -> None:
    """A table of two stages, ``check`` (whose blocking check passes or not) and ``after`` (reads it), and their
    assets, in place of the mix's."""
    first = dg.AssetKey([mix.name, "check"])

    @dg.asset(key=first, check_specs=[dg.AssetCheckSpec("fits", asset=first, blocking=True)])
    def check() -> dg.MaterializeResult:
        return dg.MaterializeResult(
            metadata={"figure": 1.5},
            check_results=[dg.AssetCheckResult(check_name="fits", passed=passed, description="the figure fits")],
        )

    @dg.asset(key=[mix.name, "after"], deps=[first])
    def after() -> None:
        return None

    table = (Stage("check", False, (), lambda *_a: None), Stage("after", False, ("check",), lambda *_a: None))
    monkeypatch.setattr(stages, "STAGES", table)
    monkeypatch.setattr(build, "mix_assets", lambda _mix: [check, after])


def test_a_failed_blocking_check_stops_the_run_and_marks_no_asset_failed(
    tiny_mix_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mix = load_mix(tiny_mix_path)
    _two_stages(monkeypatch, mix, passed=False)
    instance = dg.DagsterInstance.ephemeral()
    said: list[str] = []
    with pytest.raises(BlockingCheckFailed, match="blocking check fits: the figure fits"):
        build.build_mix(mix, tmp_path / "out", say=said.append, instance=instance)
    assert said == ["  check"], "the stage after the failed check never started"
    (run,) = instance.get_runs()
    assert run.job_name == "build_tiny" and run.status == dg.DagsterRunStatus.FAILURE
    events = {e.dagster_event.event_type for e in instance.all_logs(run.run_id) if e.dagster_event}
    assert dg.DagsterEventType.ASSET_MATERIALIZATION in events and dg.DagsterEventType.ASSET_CHECK_EVALUATION in events
    # the run planned no materialization, so no asset is shown failed by it (a build elsewhere marks nothing)
    assert dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED not in events
    assert dg.DagsterEventType.ASSET_FAILED_TO_MATERIALIZE not in events
    assert instance.get_latest_materialization_event(dg.AssetKey(["tiny", "after"])) is None

    _two_stages(monkeypatch, mix, passed=True)
    build.build_mix(mix, tmp_path / "out", say=said.append, instance=instance)
    record = instance.fetch_materializations(dg.AssetKey(["tiny", "check"]), limit=1).records[0]
    assert record.asset_materialization is not None
    assert record.asset_materialization.metadata["figure"] == dg.MetadataValue.float(1.5)


@pytest.fixture
def automated_tiny(tiny_mix_path: Path, tmp_path: Path) -> tuple[dg.Definitions, Mix, Path]:
    """The definitions of the tiny mix, built under ``tmp_path/build``; its own output."""
    (tmp_path / "mixes").mkdir()
    shutil.copy(tiny_mix_path, tmp_path / "mixes" / "tiny.yaml")
    mix = load_mix(tmp_path / "mixes" / "tiny.yaml")
    return load_definitions(tmp_path / "mixes", tmp_path / "build"), mix, tmp_path / "build" / "tiny"


def _index(mix: Mix, root: Path, instance: dg.DagsterInstance, sources: list[str], **tags: str) -> None:
    """Re-index ``sources`` with the job ``build_<mix>``, one run per source, as the nightly schedule does."""
    job = build_job(mix)
    resources = {"storage": WeirStorage(root=str(root)), "engine": WeirEngine()}
    for source in sources:
        assert job.execute_in_process(partition_key=source, instance=instance, resources=resources, tags=tags).success


def _requested(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: object) -> tuple[set[str], object]:
    """The stages one evaluation of the automation conditions requests, and the cursor for the next one."""
    result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=cursor)  # type: ignore[arg-type]
    return {s.name for s in stages.STAGES if result.get_num_requested(dg.AssetKey(["tiny", s.name]))}, result.cursor


def test_automation_takes_no_news_from_a_whole_build_nor_from_a_build_elsewhere(
    automated_tiny: tuple[dg.Definitions, Mix, Path],
) -> None:
    defs, mix, own = automated_tiny
    instance = dg.DagsterInstance.ephemeral()
    requested, cursor = _requested(defs, instance, None)
    assert requested == set()
    for sources, tags, acted in (
        (["notes", "qa"], {BUILD_TAG: "cli", ELSEWHERE_TAG: "true"}, False),  # an experiment into another folder
        (["qa"], {BUILD_TAG: "cli"}, False),  # weir build into the mix's own folder: it builds the rest itself
        (["qa"], {BUILD_TAG: "ui"}, False),  # build_<mix> launched with no partition in the UI: likewise
        (["qa"], {}, True),  # a re-index (nightly, source sensor): automation builds the rest
    ):
        _index(mix, own.parent, instance, sources, **tags)
        requested, cursor = _requested(defs, instance, cursor)
        assert requested == ({"tokenizer"} if acted else set()), tags


def test_automation_waits_while_the_output_is_locked_and_after_a_failed_blocking_check(
    automated_tiny: tuple[dg.Definitions, Mix, Path],
) -> None:
    defs, mix, own = automated_tiny
    instance = dg.DagsterInstance.ephemeral()
    _, cursor = _requested(defs, instance, None)
    with output_lock(own, wait=False, say=lambda _s: None):  # a weir build writing the mix's own folder
        _index(mix, own.parent, instance, sorted(mix.sources))
        requested, cursor = _requested(defs, instance, cursor)
        assert requested == set()
    requested, cursor = _requested(defs, instance, cursor)
    assert requested == {"tokenizer"}, "the lock released, the index's news is acted on"

    # the plan materialized with a failed blocking check: the shards wait, whatever else changed upstream
    plan = dg.AssetKey(["tiny", "plan"])
    for key in (dg.AssetKey(["tiny", s]) for s in ("tokenizer", "length_stats", "plan")):
        instance.report_runless_asset_event(dg.AssetMaterialization(key))
    for name, passed in (("planned_documents_exist", False), ("token_budget_per_phase", True)):
        instance.report_runless_asset_event(dg.AssetCheckEvaluation(plan, name, passed, blocking=True))
    requested, cursor = _requested(defs, instance, cursor)
    assert "packed_shards" not in requested
    instance.report_runless_asset_event(dg.AssetMaterialization(plan))
    for name in ("planned_documents_exist", "token_budget_per_phase"):
        instance.report_runless_asset_event(dg.AssetCheckEvaluation(plan, name, True, blocking=True))
    requested, _ = _requested(defs, instance, cursor)
    assert "packed_shards" in requested


def test_a_build_into_the_mix_own_folder_stops_while_a_dagster_run_writes_it(
    tiny_mix_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIR_BUILD_ROOT", str(tmp_path / "build"))  # the UI's root: its own folder is build/tiny
    mix = load_mix(tiny_mix_path)
    instance = dg.DagsterInstance.ephemeral()
    own = dg.DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED,
                        asset_selection=frozenset({dg.AssetKey(["tiny", "tokenizer"])}))  # fmt: skip
    other = dg.DagsterRun(job_name="build_demo", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED)
    queued = dg.DagsterRun(job_name="build_tiny", run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.NOT_STARTED)
    for run in (own, other, queued):
        instance.add_run(run)
    # automation's run of the tokenizer writes build/tiny; another mix's does not; a run not started, with no daemon
    # to start it (a UI stopped) never will
    assert [r.run_id for r in dagster_writers(instance, mix)] == [own.run_id]
    with pytest.raises(BuildBusy, match=rf"Dagster run {own.run_id} \(__ASSET_JOB, started\) is writing this folder"):
        build_output(mix, tmp_path / "build" / "tiny", instance=instance, say=lambda _s: None)
    assert not (tmp_path / "build" / "tiny").exists() and not list((tmp_path / "build").glob(".tiny.*"))
    instance.report_run_canceled(own)
    assert dagster_writers(instance, mix) == []
