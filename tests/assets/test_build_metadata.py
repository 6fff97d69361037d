"""Build fingerprints and quarantine links in the assets' metadata, as the UI shows them."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg

from assets import WeirEngine, WeirStorage, mix_assets
from contract.shards import ShardSet
from mixing import load_mix
from mixing.stages import STAGES


def test_metadata_has_fingerprints_and_the_quarantine_file(tiny_mix_path: Path, tmp_path: Path) -> None:
    mix = load_mix(tiny_mix_path)
    defs = mix_assets(mix)
    resources = {"storage": WeirStorage(root=str(tmp_path / "build"), per_mix=False), "engine": WeirEngine()}
    instance = dg.DagsterInstance.ephemeral()
    meta: dict[tuple[str, str | None], dict] = {}
    for stage in STAGES:
        for part in stage.partitions(mix):
            result = dg.materialize(
                defs,
                selection=[dg.AssetKey([mix.name, stage.name])],
                partition_key=part,
                resources=resources,
                instance=instance,
            )
            event = result.get_asset_materialization_events()[0]
            meta[stage.name, part] = event.materialization.metadata

    manifest = ShardSet(tmp_path / "build" / "shards").manifest
    tok_fp = meta["tokenizer", None]["fingerprint"].value
    # One fingerprint per build, the same wherever the UI shows it and in the shards' manifest.
    assert manifest.tokenizer_fingerprint == tok_fp
    for stage in ("plan", "packed_shards"):
        assert meta[stage, None]["mix_fingerprint"].value == manifest.mix_fingerprint == mix.fingerprint()
        assert meta[stage, None]["tokenizer_fingerprint"].value == tok_fp
    for source in mix.sources:
        docs = meta["documents", source]
        assert docs["tokenizer_fingerprint"].value == tok_fp
        link = docs["quarantine"]
        assert isinstance(link, dg.PathMetadataValue)
        lines = Path(link.value).read_text().splitlines()
        # The file behind the link holds exactly the records the count says were quarantined.
        assert len(lines) == docs["docs_quarantined"].value
    bad = [json.loads(line) for line in Path(meta["documents", "qa"]["quarantine"].value).read_text().splitlines()]
    assert len(bad) == 1 and "line" in bad[0], bad
