"""How the UI builds the later stages after a source is re-indexed: declarative automation chains them.

A mix mixes per-source partitioned assets (``source_index``, ``documents``) with unpartitioned ones
(``tokenizer`` trains on every source; ``length_stats``, ``plan``, ``packed_shards`` see all of them). A whole
build is one run of the job ``build_<mix>`` (:mod:`pipelines.build`); a run of it for one source (the nightly
schedule, the source sensor) re-indexes that source, and every later stage carries :func:`chained`: it is
requested as soon as its upstream partitions were updated and none is missing or still in progress, the
upstream blocking checks passed, and no ``weir build`` holds the output's lock. The tokenizer waits for every
source's index; each source's documents then tokenize in their own run, in parallel; the stats, plan and shards
follow once every source's documents are in. *Materialize all* on the group in the UI (an asset backfill, one
run per asset partition) builds the same graph in the same order.

What automation leaves alone: a whole build (``weir build``, or ``build_<mix>`` launched with no partition)
already built every stage, so its materializations (run tag :data:`pipelines.build.BUILD_TAG`) are not news to
act on; they do count as the stages' latest builds, so nothing stays pending from before them. A ``weir build``
into another output than the mix's own (:data:`pipelines.build.ELSEWHERE_TAG`) counts for nothing at all.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import dagster as dg

from mixing import Mix, stages
from pipelines.build import BUILD_TAG, ELSEWHERE_TAG
from pipelines.output_lock import lock_holder

__all__ = ["LatestBuiltBy", "OutputFree", "automated", "automation_sensor", "chained"]


class OutputFree(dg.AutomationCondition):  # type: ignore[type-arg]
    """True while no process holds the output's lock (:func:`pipelines.output_lock.lock_holder`): a ``weir
    build`` writing the mix's own output keeps automation from starting a run that would write it too.

    Python evaluated in the code server, so the automation sensor runs there (``use_user_code_server``).
    """

    def __init__(self, output: Path | str) -> None:
        self.output = output

    @property
    def name(self) -> str:
        return "output_free"

    @property
    def description(self) -> str:
        return f"no weir build holds the lock of {self.output}"

    def evaluate(self, context: dg.AutomationContext) -> dg.AutomationResult:  # type: ignore[type-arg]
        held = lock_holder(self.output) is not None
        return dg.AutomationResult(context, context.get_empty_subset() if held else context.candidate_subset)


class LatestBuiltBy(dg.AutomationCondition):  # type: ignore[type-arg]
    """True for each partition (or the asset) whose latest materialization was made by a run tagged ``tag``
    (with ``value``, when given).

    Dagster's own tag conditions do not serve here: ``executed_with_tags`` looks only at the partition an asset
    was last materialized in (a build re-indexes every source), and ``all_new_updates_have_run_tags`` sees
    nothing on the tick after one that found an instance without any event (a new UI's first tick).
    """

    def __init__(self, tag: str, value: str | None = None) -> None:
        self.tag = tag
        self.value = value

    @property
    def name(self) -> str:
        return f"latest_built_by({self.tag}" + (f"={self.value})" if self.value else ")")

    @property
    def description(self) -> str:
        return f"the latest materialization was made by a run tagged {self.tag}" + (
            f"={self.value}" if self.value else ""
        )

    def evaluate(self, context: dg.AutomationContext) -> dg.AutomationResult:  # type: ignore[type-arg]
        candidate = context.candidate_subset
        if candidate.is_partitioned:
            found = {p for p in candidate.expensively_compute_partition_keys() if self._built_by(context, p)}
            true = candidate.compute_intersection_with_partition_keys(found)
        else:
            true = candidate if not candidate.is_empty and self._built_by(context, None) else context.get_empty_subset()
        return dg.AutomationResult(context, true)

    def _built_by(self, context: dg.AutomationContext, partition: str | None) -> bool:  # type: ignore[type-arg]
        instance = context.asset_graph_view.instance
        latest = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=context.key, asset_partitions=[partition] if partition else None), limit=1
        ).records
        run = instance.get_run_by_id(latest[0].run_id) if latest else None
        if run is None:
            return False
        return run.tags.get(self.tag) == self.value if self.value else self.tag in run.tags


def chained(output: Path | str | None) -> dg.AutomationCondition:  # type: ignore[type-arg]
    """``eager`` as Dagster defines it, with what :mod:`this module <pipelines.automation>` says automation
    leaves alone: an upstream update counts only when it was not part of a whole build; the condition's memory of
    having handled an update is reset by any build of this output (not by a build elsewhere); and the request
    also needs every upstream blocking check passed and ``output``'s lock free (:class:`OutputFree`; with
    ``output`` ``None``, no lock is watched)."""
    ac = dg.AutomationCondition
    here = (ac.newly_updated() & ~LatestBuiltBy(ELSEWHERE_TAG, "true")).with_label("newly_updated_here")
    news = (here & ~LatestBuiltBy(BUILD_TAG) & ~ac.executed_with_root_target()).with_label(
        "newly_updated_by_a_stage_run"
    )
    deps_updated = ac.any_deps_match(news | ac.will_be_requested()).with_label("any_deps_updated")
    handled = (ac.newly_requested() | here | ac.initial_evaluation()).with_label("handled")
    eager = (
        ac.in_latest_time_window()
        & (ac.newly_missing() | deps_updated).since(handled)
        & ~ac.any_deps_missing()
        & ~ac.any_deps_in_progress()
        & ~ac.in_progress()
        & ac.all_deps_blocking_checks_passed()
    )
    if output is None:
        return eager.with_label("eager, after the blocking checks")
    return (eager & OutputFree(output)).with_label("eager, after the blocking checks, not while weir build writes")


def automated(assets: Sequence[dg.AssetsDefinition], output: Path | str | None = None) -> list[dg.AssetsDefinition]:
    """``assets`` with the :func:`chained` condition on every stage of :data:`mixing.stages.STAGES` that has deps:
    all but ``source_index``, which the mix's job runs. ``output``: the mix's own output, whose lock it watches
    (:class:`OutputFree`; ``None``: none watched)."""
    chain_on = {s.name for s in stages.STAGES if s.deps}
    condition = chained(output)

    def chain(spec: dg.AssetSpec) -> dg.AssetSpec:
        if spec.key.path[-1] not in chain_on:
            return spec
        return spec.replace_attributes(automation_condition=condition)

    return [a.map_asset_specs(chain) for a in assets]


def automation_sensor(mix: Mix, interval_s: int = 15, on: bool = True) -> dg.AutomationConditionSensorDefinition:
    """The sensor that evaluates the mix's automation conditions every ``interval_s`` seconds, in the code
    server (:class:`OutputFree` is Python of this project, which the daemon cannot run).

    ``on`` is its status in an instance that has not recorded one (``WEIR_AUTOMATION=off`` at load time turns
    it off: a UI that only shows builds made elsewhere, as the browser test's, must not start runs).
    """
    with warnings.catch_warnings():  # use_user_code_server is marked beta; this project needs it (see above)
        warnings.simplefilter("ignore", dg.BetaWarning)
        return dg.AutomationConditionSensorDefinition(
            f"automation_{mix.name}",
            target=dg.AssetSelection.groups(mix.name),
            default_status=dg.DefaultSensorStatus.RUNNING if on else dg.DefaultSensorStatus.STOPPED,
            minimum_interval_seconds=interval_s,
            use_user_code_server=True,
            description=f"Runs the stages of mix {mix.name!r} after a source's index, in dependency order.",
        )
