"""Dagster definitions: every mix file under ``mixes/`` (or ``$WEIR_MIXES``) becomes an asset group.

Builds go under ``build/`` (or ``$WEIR_BUILD_ROOT``: a folder or an ``s3://`` URL), one per mix; tokenizing
and shard writing run where ``$WEIR_ENGINE`` says (``local`` or ``ray`` at ``$WEIR_RAY_ADDRESS``). Loaded by ``dg dev``,
``dagster dev -w workspace.yaml`` and ``weir ui``. Per mix: the assets and their checks, the job ``build_<mix>``
(:func:`pipelines.build.build_job`: launched with no partition, a whole build in one run; for one source, a
re-index of that source, after which automation runs every later stage, see :mod:`pipelines.automation`), a
nightly schedule, a sensor on the sources' files, and the automation sensor; for the code location, the sensor
that reports failed runs (:func:`pipelines.sensors.failure_sensor`).
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg

from assets import mix_assets
from assets.invalid_mix import invalid_mix_assets, invalid_mix_group
from contract.errors import WeirError
from mixing import Mix, MixError, load_mix
from pipelines import PROJECT_ROOT
from pipelines.automation import automated, automation_sensor
from pipelines.build import build_job, ui_build_root, ui_output
from pipelines.executors import executor_from_env
from pipelines.resources import engine_resource, storage_resource
from pipelines.schedules import nightly_schedule
from pipelines.sensors import failure_sensor, source_sensor

__all__ = ["defs", "load_definitions", "mix_job"]


def mix_job(mix: Mix) -> dg.JobDefinition:
    """The job ``build_<mix>`` (:func:`pipelines.build.build_job`): one run builds the mix, every stage and
    source (launched with no partition: the job's *Launchpad*, *Launch run*; ``weir build`` runs the same job
    in its own process); a run for one source re-indexes it (``dg launch --job build_<mix> --partition
    <source>``, the nightly schedule, the source sensor) and automation builds the rest.
    """
    return build_job(mix)


def load_definitions(mixes_dir: Path, build_root: Path | str) -> dg.Definitions:
    """Definitions for every ``*.yaml`` mix file in ``mixes_dir`` (sorted by name).

    A file that does not load (an invalid mix, or a name another file already declares) takes down no other
    mix: it becomes a group named after the file with one asset, ``mix_file``, whose description and
    metadata carry the one-line error (file, line, field) and whose check ``mix_file_valid`` fails with it.
    """
    mixes: list[Mix] = []
    broken: list[tuple[Path, str]] = []
    owner: dict[str, Path] = {}
    for p in sorted(mixes_dir.glob("*.yaml")):
        try:
            m = load_mix(p)
        except MixError as e:
            broken.append((p, str(e)))
            continue
        if m.name in owner:
            broken.append((p, f"{p}: name: mix {m.name!r} is already declared by {owner[m.name]}; expected a new name"))
            continue
        owner[m.name] = p
        mixes.append(m)
    automation_on = os.environ.get("WEIR_AUTOMATION", "on") != "off"
    interval = os.environ.get("WEIR_AUTOMATION_INTERVAL", "15").strip()
    if not (interval.isascii() and interval.isdigit() and int(interval) > 0):
        raise WeirError(f"WEIR_AUTOMATION_INTERVAL={interval!r}: expected a whole number of seconds, at least 1")
    assets: list[dg.AssetsDefinition] = []
    checks: list[dg.AssetChecksDefinition] = []
    jobs, schedules, sensors = [], [], []
    for m in mixes:
        try:
            group = automated(mix_assets(m), ui_output(m, build_root))
            job = mix_job(m)
            mix_sensors = [source_sensor(m, job), automation_sensor(m, int(interval), on=automation_on)]
            schedule = nightly_schedule(m, job)
        except (WeirError, dg.DagsterError, ValueError) as e:  # a valid mix Dagster refuses: still only this one
            broken.append((owner[m.name], f"{owner[m.name]}: cannot define mix {m.name!r}: {type(e).__name__}: {e}"))
            continue
        assets += group
        jobs.append(job)
        schedules.append(schedule)
        sensors += mix_sensors
    taken = {m.name for m in mixes}
    for p, error in broken:
        name = invalid_mix_group(p, taken)
        taken.add(name)
        asset, check = invalid_mix_assets(p, name, error)
        assets.append(asset)
        checks.append(check)
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=jobs,
        schedules=schedules,
        sensors=[*sensors, failure_sensor()],
        resources={"storage": storage_resource(build_root), "engine": engine_resource()},
        executor=executor_from_env(),
    )


defs = load_definitions(Path(os.environ.get("WEIR_MIXES", PROJECT_ROOT / "mixes")), ui_build_root())
