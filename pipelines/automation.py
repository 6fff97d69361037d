"""How a build runs to the end: declarative automation chains the stages after the per-source index.

A mix mixes per-source partitioned assets (``source_index``, ``documents``) with unpartitioned ones
(``tokenizer`` trains on every source; ``length_stats``, ``plan``, ``packed_shards`` see all of them), and a
Dagster run covers one partition of its assets, so no single run can build a mix. Instead the mix's job
re-indexes sources (one run per source, run side by side) and every later stage is ``eager``: it is requested
as soon as its upstream partitions were updated and none is missing or still in progress. The tokenizer waits
for every source's index; each source's documents then tokenize in their own run, in parallel; the stats,
plan and shards follow once every source's documents are in. Launching "Materialize all" on the group in the
UI (an asset backfill) builds the same graph in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence

import dagster as dg

from mixing import Mix, stages

__all__ = ["automated", "automation_sensor"]


def automated(assets: Sequence[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:
    """``assets`` with an ``eager`` automation condition on every stage of :data:`mixing.stages.STAGES` that
    has deps: all but ``source_index``, which the mix's job runs."""
    chained = {s.name for s in stages.STAGES if s.deps}

    def chain(spec: dg.AssetSpec) -> dg.AssetSpec:
        if spec.key.path[-1] not in chained:
            return spec
        return spec.replace_attributes(automation_condition=dg.AutomationCondition.eager())

    return [a.map_asset_specs(chain) for a in assets]


def automation_sensor(mix: Mix, interval_s: int = 15, on: bool = True) -> dg.AutomationConditionSensorDefinition:
    """The sensor that evaluates the mix's automation conditions every ``interval_s`` seconds.

    ``on`` is its status in an instance that has not recorded one (``WEIR_AUTOMATION=off`` at load time turns
    it off: a UI that only shows builds made elsewhere, as the browser test's, must not start runs).
    """
    return dg.AutomationConditionSensorDefinition(
        f"automation_{mix.name}",
        target=dg.AssetSelection.groups(mix.name),
        default_status=dg.DefaultSensorStatus.RUNNING if on else dg.DefaultSensorStatus.STOPPED,
        minimum_interval_seconds=interval_s,
        description=f"Runs the stages of mix {mix.name!r} after the per-source index, in dependency order.",
    )
