"""The documents asset: quarantine metadata and the docs_accounted check (seen = kept + quarantined)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from assets import WeirEngine, WeirStorage, mix_assets
from mixing import load_mix
from mixing.stages import stages_until


def _int(meta: Mapping[str, dg.MetadataValue], key: str) -> int:
    """``meta[key]`` as the count it is (Dagster types a metadata value's ``.value`` as any packable value)."""
    value = meta[key]
    assert isinstance(value, dg.IntMetadataValue) and value.value is not None, (key, value)
    return value.value


def test_documents_metadata_and_accounting_check(tiny_mix_path: Path, tmp_path: Path) -> None:
    mix = load_mix(tiny_mix_path)
    defs = mix_assets(mix)
    res = {"storage": WeirStorage(root=str(tmp_path / "b"), per_mix=False), "engine": WeirEngine()}
    inst = dg.DagsterInstance.ephemeral()
    for stage in stages_until("documents"):
        for part in stage.partitions(mix):
            r = dg.materialize(
                defs, selection=[dg.AssetKey([mix.name, stage.name])], partition_key=part, resources=res, instance=inst
            )
            assert r.success
    mats = [e for e in r.get_asset_materialization_events()]
    meta = mats[-1].materialization.metadata
    assert _int(meta, "docs_seen") == _int(meta, "docs_kept") + _int(meta, "docs_quarantined") == 41
    assert meta["quarantine_reasons"].value == {"invalid JSON": 1}
    quarantine, sample = meta["quarantine"], meta["quarantine_sample"]
    assert isinstance(quarantine, dg.PathMetadataValue) and isinstance(sample, dg.JsonMetadataValue)
    assert Path(quarantine.value).read_text().count("\n") == 1
    assert isinstance(sample.value, list) and sample.value[0]["line"] == 6
    checks = r.get_asset_check_evaluations()
    assert [(c.check_name, c.passed) for c in checks] == [("docs_accounted", True)]
