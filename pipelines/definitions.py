"""Dagster definitions: every mix file under ``mixes/`` (or ``$WEIR_MIXES``) becomes an asset group.

Builds go under ``build/`` (or ``$WEIR_BUILD_ROOT``), one folder per mix. Loaded by ``dg dev``,
``dagster dev -w workspace.yaml`` and ``weir ui``. Per mix: the assets and their checks, a job
``build_<mix>`` (partitioned by source: re-index sources; automation runs every later stage, see
:mod:`pipelines.automation`), a nightly schedule, a sensor on the sources' files, and the automation sensor.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg

from assets import mix_assets
from mixing import Mix, load_mix
from pipelines.automation import automated, automation_sensor
from pipelines.executors import executor_from_env
from pipelines.resources import storage_resource
from pipelines.schedules import nightly_schedule
from pipelines.sensors import source_sensor

if TYPE_CHECKING:  # the class of define_asset_job's result is not exported by dagster
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition as AssetJob,
    )

__all__ = ["defs", "load_definitions", "mix_job"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def mix_job(mix: Mix) -> AssetJob:
    """The job that starts a build of ``mix``: one run per source partition re-indexes that source.

    Automation then builds the rest (tokenizer, documents per source, stats, plan, shards). From the command
    line: ``dg launch --job build_<mix> --partition <source>``; from the UI: the job's "Launch backfill"
    (every source), or "Materialize all" on the asset group.
    """
    return dg.define_asset_job(
        f"build_{mix.name}",
        selection=dg.AssetSelection.assets(dg.AssetKey([mix.name, "source_index"])),
        description=f"Start a build of mix {mix.name!r}: re-index a source; its later stages follow automatically.",
    )


def load_definitions(mixes_dir: Path, build_root: Path) -> dg.Definitions:
    """Definitions for every ``*.yaml`` mix file in ``mixes_dir`` (sorted by name).

    An invalid mix file raises :class:`mixing.MixError` naming file, line and field, so the problem shows
    where the definitions are loaded (the UI's code-location error, ``dg check defs``).
    """
    mixes = [load_mix(p) for p in sorted(mixes_dir.glob("*.yaml"))]
    names = [m.name for m in mixes]
    if len(set(names)) != len(names):
        raise ValueError(f"{mixes_dir}: two mix files declare the same name: {sorted(names)}")
    automation_on = os.environ.get("WEIR_AUTOMATION", "on") != "off"
    assets, jobs, schedules, sensors = [], [], [], []
    for m in mixes:
        group = automated(mix_assets(m))
        job = mix_job(m)
        assets += group
        jobs.append(job)
        schedules.append(nightly_schedule(m, job))
        sensors += [source_sensor(m, job), automation_sensor(m, on=automation_on)]
    return dg.Definitions(
        assets=assets,
        jobs=jobs,
        schedules=schedules,
        sensors=sensors,
        resources={"storage": storage_resource(build_root)},
        executor=executor_from_env(),
    )


defs = load_definitions(
    Path(os.environ.get("WEIR_MIXES", PROJECT_ROOT / "mixes")),
    Path(os.environ.get("WEIR_BUILD_ROOT", PROJECT_ROOT / "build")),
)
