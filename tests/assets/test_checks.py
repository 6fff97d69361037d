"""The checks of assets/checks.py pass on consistent counts and fail, with a one-line reason, otherwise."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest

from assets import WeirStorage, mix_assets
from assets.checks import ingest_counts_check, mix_checks
from mixing import load_mix


def _stub_documents(counts: dict[str, int]) -> dg.AssetsDefinition:
    """A stand-in for ``[tiny, documents]`` that only records ``counts`` as its metadata."""

    @dg.asset(key=["tiny", "documents"], partitions_def=dg.StaticPartitionsDefinition(["notes", "qa"]))
    def documents() -> dg.MaterializeResult:
        return dg.MaterializeResult(metadata=counts)

    return documents


@pytest.mark.parametrize(
    ("counts", "passed", "reason"),
    [
        ({"docs_seen": 41, "docs_kept": 40, "docs_quarantined": 1}, True, "qa: 41 seen = 40 kept + 1 quarantined"),
        ({"docs_seen": 41, "docs_kept": 39, "docs_quarantined": 1}, False, "(+1 lost)"),
        ({"rows": 3}, False, "no ingest counts recorded"),
    ],
)
def test_ingest_counts(tiny_mix_path: Path, tmp_path: Path, counts: dict[str, int], passed: bool, reason: str) -> None:
    stub = _stub_documents(counts)
    mix = load_mix(tiny_mix_path)
    storage = WeirStorage(root=str(tmp_path / "build"))
    quarantine = storage.layout(mix).source_dir("qa") / "quarantine.jsonl"
    quarantine.parent.mkdir(parents=True)
    quarantine.write_text('{"file": "qa.jsonl", "line": 6, "reason": "not JSON"}\n')
    check = ingest_counts_check(mix, stub)
    result = dg.materialize(
        [stub, check], partition_key="qa", resources={"storage": storage}, instance=dg.DagsterInstance.ephemeral()
    )
    [evaluation] = result.get_asset_check_evaluations()
    assert evaluation.passed is passed
    if "docs_seen" in counts:  # the link a person follows to the malformed records
        assert evaluation.metadata["quarantine_file"].value == str(quarantine)
    assert evaluation.description is not None and reason in evaluation.description
    assert "\n" not in evaluation.description  # one line in the UI


def test_checks_are_added_only_where_the_asset_body_does_not_declare_them(tiny_mix_path: Path) -> None:
    mix = load_mix(tiny_mix_path)
    assets = mix_assets(mix)
    declared = {ck.name for a in assets for ck in a.check_keys}
    added = {ck.name for c in mix_checks(mix, assets) for ck in c.check_keys}
    assert not declared & added
    assert "ingest_counts" in declared | added
