"""``assets/mix_assets.py``: the assets of a mix as the UI shows them: one build fingerprint wherever it is
shown, quarantine links to the records counted; the ``mixture_error`` check's verdict (docs/design.md's goals,
or one whole unit's share where that is more) in one line; metadata tables holding every row; storage options
handed only to mixes that read a remote store. (The graph's shape: ``test_stage_table.py``; the documents and
plan assets: ``test_documents_asset.py``, ``test_plan_assets.py``; the stream check: ``test_checks.py``.)"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import dagster as dg
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assets import WeirEngine, WeirStorage, mix_assets
from assets.mix_assets import _markdown, _s3
from contract.shards import ShardSet
from mixing import load_mix
from mixing.report import inspect_build
from mixing.stages import STAGES


def test_metadata_has_fingerprints_and_the_quarantine_file(tiny_mix_path: Path, tmp_path: Path) -> None:
    mix = load_mix(tiny_mix_path)
    defs = mix_assets(mix)
    resources = {"storage": WeirStorage(root=str(tmp_path / "build"), per_mix=False), "engine": WeirEngine()}
    instance = dg.DagsterInstance.ephemeral()
    meta: dict[tuple[str, str | None], Mapping[str, dg.MetadataValue]] = {}
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
    for name in ("plan", "packed_shards"):
        assert meta[name, None]["mix_fingerprint"].value == manifest.mix_fingerprint == mix.fingerprint()
        assert meta[name, None]["tokenizer_fingerprint"].value == tok_fp
    for source in mix.sources:
        docs = meta["documents", source]
        assert docs["tokenizer_fingerprint"].value == tok_fp
        link = docs["quarantine"]
        assert isinstance(link, dg.PathMetadataValue)
        lines = Path(link.value).read_text().splitlines()
        # The file behind the link holds exactly the records the count says were quarantined.
        assert len(lines) == docs["docs_quarantined"].value
    qa_link = meta["documents", "qa"]["quarantine"]
    assert isinstance(qa_link, dg.PathMetadataValue)
    bad = [json.loads(line) for line in Path(qa_link.value).read_text().splitlines()]
    assert len(bad) == 1 and "line" in bad[0], bad
    # The build's figures are numbers (the UI plots them across builds), equal to what inspect reports.
    report = inspect_build(tmp_path / "build")
    shards = meta["packed_shards", None]
    figures = {
        "tokens": report.tokens,
        "packing_efficiency": report.packing_efficiency,
        "mixture_error_window": report.mixture_error.window,
        "sequence_cost_p95_over_mean": report.sequence_cost.p95_over_mean,
    }
    for key, value in figures.items():
        assert isinstance(shards[key], (dg.IntMetadataValue, dg.FloatMetadataValue)), key
        assert shards[key].value == pytest.approx(value), key


SHARES = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@settings(max_examples=100)
@given(
    rows=st.lists(
        st.tuples(st.text("abcxyz_", min_size=1, max_size=5), st.integers(-(10**9), 10**9), SHARES), max_size=8
    )
)
def test_a_metadata_table_holds_every_row_and_floats_to_four_decimals(rows: list[tuple[str, int, float]]) -> None:
    df = pl.DataFrame(rows, schema={"source": pl.String, "docs": pl.Int64, "share": pl.Float64}, orient="row")
    lines = _markdown(df).splitlines()
    assert lines[:2] == ["| source | docs | share |", "|---|---|---|"]
    assert len(lines) == 2 + len(rows)
    for line, (name, docs, share) in zip(lines[2:], rows, strict=True):
        assert line == f"| {name} | {docs} | {share:.4f} |"


def test_storage_options_go_only_to_mixes_reading_a_remote_store(tiny_mix_path: Path) -> None:
    storage = WeirStorage(root="build", s3_endpoint_url="http://127.0.0.1:9", aws_region="eu-west-1")
    assert _s3(load_mix(tiny_mix_path), storage) is None
    local = tiny_mix_path.read_text().replace('uri: "', 'uri: "file://', 1)
    tiny_mix_path.write_text(local)
    assert _s3(load_mix(tiny_mix_path), storage) is None, "file:// is local"
    tiny_mix_path.write_text(local.replace(f'"{tiny_mix_path.parent}/data/qa.jsonl"', '"s3://corpus/qa.jsonl"'))
    assert load_mix(tiny_mix_path).source_uri("qa") == "s3://corpus/qa.jsonl"
    assert _s3(load_mix(tiny_mix_path), storage) == storage.storage_options()
