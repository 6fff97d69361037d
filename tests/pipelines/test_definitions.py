"""The Dagster definitions load, and the whole asset graph materializes on a tiny mix."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from assets import WeirEngine, WeirStorage, mix_assets
from mixing import load_mix
from mixing.stages import STAGES
from pipelines.definitions import defs, load_definitions

ROOT = Path(__file__).resolve().parents[2]


def _int(meta: Mapping[str, dg.MetadataValue], key: str) -> int:
    """``meta[key]`` as the count it is (Dagster types a metadata value's ``.value`` as any packable value)."""
    value = meta[key]
    assert isinstance(value, dg.IntMetadataValue) and value.value is not None, (key, value)
    return value.value


def test_project_definitions_load_with_the_demo_mix() -> None:
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {f"demo/{s.name}" for s in STAGES} <= keys
    assert defs.resolve_job_def("build_demo") is not None


def test_every_mix_file_is_a_group(tmp_path: Path, tiny_mix_path: Path) -> None:
    mixes = tmp_path / "mixes"
    mixes.mkdir()
    shutil.copy(ROOT / "mixes" / "demo.yaml", mixes / "demo.yaml")
    shutil.copy(tiny_mix_path, mixes / "tiny.yaml")
    d = load_definitions(mixes, tmp_path / "build")
    groups = {d.resolve_asset_graph().get(k).group_name for k in d.resolve_asset_graph().get_all_asset_keys()}
    assert groups == {"demo", "tiny"}


def test_materialize_whole_graph_on_tiny_mix(tiny_mix_path: Path, tmp_path: Path) -> None:
    mix = load_mix(tiny_mix_path)
    assets = mix_assets(mix)
    resources = {"storage": WeirStorage(root=str(tmp_path / "build")), "engine": WeirEngine()}
    instance = dg.DagsterInstance.ephemeral()
    for source in sorted(mix.sources):
        result = dg.materialize(
            assets,
            selection=[dg.AssetKey(["tiny", s]) for s in ("source_index",)],
            partition_key=source,
            resources=resources,
            instance=instance,
        )
        assert result.success
    assert dg.materialize(
        assets, selection=[dg.AssetKey(["tiny", "tokenizer"])], resources=resources, instance=instance
    ).success
    for source in sorted(mix.sources):
        r = dg.materialize(
            assets,
            selection=[dg.AssetKey(["tiny", "documents"])],
            partition_key=source,
            resources=resources,
            instance=instance,
        )
        mat = r.asset_materializations_for_node("tiny__documents")[0]
        meta = mat.metadata
        assert _int(meta, "docs_seen") == _int(meta, "docs_kept") + _int(meta, "docs_quarantined")
    rest = [dg.AssetKey(["tiny", s]) for s in ("length_stats", "plan", "packed_shards")]
    result = dg.materialize(assets, selection=rest, resources=resources, instance=instance)
    assert result.success
    checks = {(e.asset_key.path[-1], e.check_name): e.passed for e in result.get_asset_check_evaluations()}
    warn_only = {("packed_shards", "packing_efficiency"), ("packed_shards", "mixture_error"), ("plan", "mixture_error")}
    assert set(checks) == warn_only | {
        ("packed_shards", "truncated_docs"),
        ("packed_shards", "manifest_checksums"),
        ("plan", "planned_documents_exist"),
        ("plan", "token_budget_per_phase"),
    }
    assert all(passed for key, passed in checks.items() if key not in warn_only)  # WARN checks: tiny is coarse
    assert (tmp_path / "build" / "tiny" / "shards" / "manifest.json").exists()


# --- operating from the UI: the definitions load whole (each part: test_schedules.py, test_sensors.py,
# test_executors.py, test_resources.py, test_automation.py) ------------------------------------------------


def test_definitions_are_loadable_as_the_ui_loads_them() -> None:
    """What `dg check defs` does in-process: every job, schedule and sensor resolves."""
    dg.Definitions.validate_loadable(defs)
    repo = defs.get_repository_def()
    assert {"build_demo"} <= {j.name for j in repo.get_all_jobs()}
    assert repo.has_schedule_def("nightly_demo")
    assert repo.has_sensor_def("sources_demo") and repo.has_sensor_def("automation_demo")
    job = defs.resolve_job_def("build_demo")
    assert job.partitions_def is not None and set(job.partitions_def.get_partition_keys()) == {"code", "prose", "qa"}
    assert job.executor_def.name == "multiprocess"


def test_loading_the_definitions_is_silent_and_neither_draws_nor_packs() -> None:
    """Every process of the UI loads them (its code server, each step's process): matplotlib (~0.6 s of imports)
    and numba (~0.3 s) are loaded by the stages that draw and pack, not by loading the definitions and resolving
    every job; and that says nothing (``weir ui`` printed a Dagster beta warning on every start)."""
    code = (
        "import sys\n"
        "from pipelines.definitions import defs\n"
        "defs.get_repository_def().get_all_jobs()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'numba')))"
    )
    r = subprocess.run([sys.executable, "-W", "default", "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]" and r.stderr == "", (r.stdout, r.stderr)


def test_every_stage_after_the_index_is_automated() -> None:
    graph = defs.resolve_asset_graph()
    automated = {k.path[-1] for k in graph.get_all_asset_keys() if graph.get(k).automation_condition is not None}
    assert automated == {s.name for s in STAGES} - {"source_index"}


# --- one broken mix file takes down no other mix -------------------------------------------------


def _one_good_one_broken(tmp_path: Path, tiny_mix_path: Path) -> Path:
    mixes = tmp_path / "mixes"
    mixes.mkdir(exist_ok=True)
    shutil.copy(tiny_mix_path, mixes / "tiny.yaml")
    broken = tiny_mix_path.read_text().replace("name: tiny", "name: broken").replace("notes: 0.75", "notes: .nan")
    (mixes / "broken.yaml").write_text(broken)
    twin = tiny_mix_path.read_text()  # a second file declaring the name tiny: the later file is the broken one
    (mixes / "z_twin.yaml").write_text(twin)
    return mixes


def test_a_broken_mix_file_is_a_group_showing_its_error_and_the_others_load(
    tmp_path: Path, tiny_mix_path: Path
) -> None:
    mixes = _one_good_one_broken(tmp_path, tiny_mix_path)
    d = load_definitions(mixes, tmp_path / "build")
    dg.Definitions.validate_loadable(d)
    graph = d.resolve_asset_graph()
    groups = {k.to_user_string(): graph.get(k).group_name for k in graph.get_all_asset_keys()}
    assert {f"tiny/{s.name}" for s in STAGES} <= set(groups)  # the good mix is whole
    assert groups["broken/mix_file"] == "broken" and groups["z_twin/mix_file"] == "z_twin"
    assert d.resolve_job_def("build_tiny") is not None
    node = graph.get(dg.AssetKey(["broken", "mix_file"]))
    error = node.metadata["error"]
    assert error.startswith(f"{mixes / 'broken.yaml'}:9: curriculum[0].mixture.notes: nan is not a finite"), error
    assert error in (node.description or "") and "\n" not in error
    twin = graph.get(dg.AssetKey(["z_twin", "mix_file"])).metadata["error"]
    assert "already declared by" in twin and "tiny.yaml" in twin
    # Materializing the placeholder fails with the error; its check fails with it too.
    instance = dg.DagsterInstance.ephemeral()
    key = dg.AssetKey(["broken", "mix_file"])
    job = d.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(instance=instance, asset_selection=[key], raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    error_info = failure.step_failure_data.error
    assert error_info is not None and error_info.cause is not None and "nan is not a finite" in error_info.cause.message
    checked = dg.materialize(
        [d.resolve_assets_def(key), *(d.asset_checks or [])],
        selection=dg.AssetSelection.checks_for_assets(key),
        instance=instance,
        raise_on_error=False,
    )
    [evaluation] = checked.get_asset_check_evaluations()
    assert not evaluation.passed and evaluation.description == error


def test_the_code_location_loads_with_a_broken_mix_in_weir_mixes(tmp_path: Path, tiny_mix_path: Path) -> None:
    """As ``dagster dev -m pipelines.definitions`` loads it: the module imports, every good mix is there."""
    import subprocess
    import sys

    mixes = _one_good_one_broken(tmp_path, tiny_mix_path)
    code = (
        "from pipelines.definitions import defs; g = defs.resolve_asset_graph(); "
        "print(sorted({g.get(k).group_name for k in g.get_all_asset_keys()}))"
    )
    env = {**__import__("os").environ, "WEIR_MIXES": str(mixes), "WEIR_BUILD_ROOT": str(tmp_path / "build")}
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == "['broken', 'tiny', 'z_twin']"
