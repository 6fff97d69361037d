"""Declarative automation finishes a build the job started, as the daemon would: evaluate the automation
conditions, run what they request, repeat. Every later stage runs exactly once per source index, each after
its inputs, and the mix ends up built. Its sensor runs unless configuration (``WEIR_AUTOMATION=off``) turns it
off."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import pytest

from assets import WeirEngine, WeirStorage
from mixing import load_mix
from mixing.stages import STAGES
from pipelines.automation import automation_sensor
from pipelines.definitions import load_definitions


def test_indexing_every_source_builds_the_rest_once_in_order(tmp_path: Path, tiny_mix_path: Path) -> None:
    (tmp_path / "mixes").mkdir()
    shutil.copy(tiny_mix_path, tmp_path / "mixes" / "tiny.yaml")
    defs = load_definitions(tmp_path / "mixes", tmp_path / "build")
    instance = dg.DagsterInstance.ephemeral()
    resources = {"storage": WeirStorage(root=str(tmp_path / "build")), "engine": WeirEngine()}
    runnable: list[dg.AssetsDefinition | dg.AssetSpec | dg.SourceAsset] = []
    for a in defs.assets or []:
        assert isinstance(a, (dg.AssetsDefinition, dg.AssetSpec, dg.SourceAsset)), a  # none is cacheable
        runnable.append(a)

    def key(stage: str) -> dg.AssetKey:
        return dg.AssetKey(["tiny", stage])

    def run(stage: str, partition: str | None) -> None:
        r = dg.materialize(runnable, selection=[key(stage)], partition_key=partition, resources=resources,
                           instance=instance)  # fmt: skip
        assert r.success

    result = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    assert result.total_requested == 0  # nothing indexed yet: every later stage waits
    job = defs.resolve_job_def("build_tiny")
    assert job.execute_in_process(partition_key="notes", instance=instance, resources=resources).success
    result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
    assert result.total_requested == 0  # one source indexed, the other missing: the tokenizer waits for both
    assert job.execute_in_process(partition_key="qa", instance=instance, resources=resources).success

    waves: list[dict[str, list[str | None]]] = []
    while True:  # the daemon's loop: evaluate, launch what is requested, evaluate again
        result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
        if result.total_requested == 0:
            break
        assert len(waves) < len(STAGES), waves
        wave = {
            s: sorted(result.get_requested_partitions(key(s)), key=str)
            for s in (t.name for t in STAGES)
            if result.get_num_requested(key(s))
        }
        waves.append(wave)
        for stage, partitions in wave.items():
            for p in partitions:
                run(stage, p)

    ran = [(s, p) for wave in waves for s, parts in wave.items() for p in parts]
    expected = [("tokenizer", None), ("documents", "notes"), ("documents", "qa")]
    expected += [(s, None) for s in ("length_stats", "plan", "packed_shards")]
    assert sorted(ran, key=str) == sorted(expected, key=str)  # each later stage once; documents once per source
    assert [s for wave in waves for s in wave] == [
        t.name for t in STAGES if t.name != "source_index"
    ]  # dependency order
    assert (tmp_path / "build" / "tiny" / "shards" / "manifest.json").exists()


def test_automation_can_be_turned_off_by_configuration(
    tiny_mix_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mix = load_mix(tiny_mix_path)
    assert automation_sensor(mix).default_status == dg.DefaultSensorStatus.RUNNING
    assert automation_sensor(mix, on=False).default_status == dg.DefaultSensorStatus.STOPPED
    (tmp_path / "mixes").mkdir()
    shutil.copy(tiny_mix_path, tmp_path / "mixes" / "tiny.yaml")
    monkeypatch.setenv("WEIR_AUTOMATION", "off")
    repo = load_definitions(tmp_path / "mixes", tmp_path / "build").get_repository_def()
    assert repo.get_sensor_def("automation_tiny").default_status == dg.DefaultSensorStatus.STOPPED
