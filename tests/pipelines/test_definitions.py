"""The Dagster definitions load, and the whole asset graph materializes on a tiny mix."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg

from assets import STAGES, WeirStorage, mix_assets
from mixing import load_mix
from pipelines.definitions import defs, load_definitions

ROOT = Path(__file__).resolve().parents[2]


def test_project_definitions_load_with_the_demo_mix() -> None:
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {f"demo/{s}" for s in STAGES} <= keys
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
    resources = {"storage": WeirStorage(root=str(tmp_path / "build"))}
    instance = dg.DagsterInstance.ephemeral()
    for source in sorted(mix.sources):
        result = dg.materialize(
            assets, selection=[dg.AssetKey(["tiny", s]) for s in ("source_index",)], partition_key=source,
            resources=resources, instance=instance,
        )
        assert result.success
    assert dg.materialize(assets, selection=[dg.AssetKey(["tiny", "tokenizer"])], resources=resources,
                          instance=instance).success
    for source in sorted(mix.sources):
        r = dg.materialize(assets, selection=[dg.AssetKey(["tiny", "documents"])], partition_key=source,
                           resources=resources, instance=instance)
        mat = r.asset_materializations_for_node("tiny__documents")[0]
        meta = {k: v.value for k, v in mat.metadata.items()}
        assert meta["docs_seen"] == meta["docs_kept"] + meta["docs_quarantined"]
    rest = [dg.AssetKey(["tiny", s]) for s in ("length_stats", "plan", "packed_shards")]
    result = dg.materialize(assets, selection=rest, resources=resources, instance=instance)
    assert result.success
    checks = {e.check_name: e.passed for e in result.get_asset_check_evaluations()}
    assert checks == {"packing_efficiency": checks["packing_efficiency"], "truncated_docs": True,
                      "manifest_checksums": True}
    assert (tmp_path / "build" / "tiny" / "shards" / "manifest.json").exists()
