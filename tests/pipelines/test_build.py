"""``pipelines/build.py``: the in-process build. Every stage's run is recorded in the instance given, in the stage
table's order, one line said per run; the stages' warnings reach ``say`` as ``warning:`` lines; a failing stage
stops the build with the stage's own error. (The lines and bars themselves: ``test_display.py``; the order
against the table: ``test_stage_table.py``; reuse across builds: ``test_incremental.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from contract.errors import WeirError
from mixing import load_mix
from mixing.stages import STAGES
from pipelines.build import build_mix
from pipelines.display import step_line


def test_every_run_is_recorded_in_the_instance_in_order_and_warnings_are_said(
    tiny_mix_path: Path, tmp_path: Path
) -> None:
    qa = tmp_path / "data" / "qa.jsonl"
    qa.write_text(qa.read_text() + json.dumps({"q": "where is the answer?"}) + "\n")
    mix = load_mix(tiny_mix_path)
    instance = dg.DagsterInstance.ephemeral()
    said: list[str] = []
    build_mix(mix, tmp_path / "out", say=said.append, instance=instance)

    runs = [(s.name, p) for s in STAGES for p in s.partitions(mix)]
    assert [line for line in said if not line.startswith("  warning: ")] == [step_line(s, p) for s, p in runs]
    warnings = [line for line in said if line.startswith("  warning: ")]
    assert any("lack template field 'a'" in w for w in warnings), said
    recorded: list[tuple[float, str, str | None]] = []  # (when, stage, partition) of every materialization
    for s in STAGES:
        for r in instance.fetch_materializations(dg.AssetKey(["tiny", s.name]), limit=100).records:
            assert r.asset_key is not None  # a materialization's record names its asset
            recorded.append((r.timestamp, r.asset_key.path[-1], r.partition_key))
    recorded.sort()
    assert [(stage, partition) for _t, stage, partition in recorded] == runs, "each run once, in the table's order"
    assert (tmp_path / "out" / "shards" / "manifest.json").is_file()


def test_a_failing_stage_stops_the_build_with_its_own_error(tiny_mix_path: Path, tmp_path: Path) -> None:
    tiny_mix_path.write_text(tiny_mix_path.read_text().replace("max_epochs: 50}", "max_epochs: 1}"))  # infeasible
    mix = load_mix(tiny_mix_path)
    instance = dg.DagsterInstance.ephemeral()
    said: list[str] = []
    with pytest.raises(Exception) as e:
        build_mix(mix, tmp_path / "out", say=said.append, instance=instance)
    # the stage's own error: raised as it is, or wrapped in Dagster's step error (what the CLI unwraps)
    error = getattr(e.value, "user_exception", None) or e.value
    assert isinstance(error, WeirError) and "source 'qa' runs out in phase 'second'" in str(error)
    assert said[-1] == step_line("plan", None), "the build stops at the failing stage"
    assert instance.get_latest_materialization_event(dg.AssetKey(["tiny", "length_stats"])) is not None
    assert instance.get_latest_materialization_event(dg.AssetKey(["tiny", "packed_shards"])) is None
    assert not (tmp_path / "out" / "shards" / "manifest.json").exists()
