"""``assets/invalid_mix.py``: a broken mix file's stand-in group gets a valid Dagster name made from the file's
stem and unique among the names taken; its asset and check carry the one-line error, and once the file is fixed
the check passes and the asset says to reload the code location (it never builds a stale definition).
(The definitions' side, a broken file beside good ones: ``tests/pipelines/test_definitions.py``.)"""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assets.invalid_mix import invalid_mix_assets, invalid_mix_group
from mixing import MixError, load_mix

DAGSTER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
STEMS = st.text(st.characters(blacklist_characters="/\x00", blacklist_categories=["Cs"]), max_size=20)


@settings(max_examples=200)
@given(stems=st.lists(STEMS, min_size=1, max_size=6), taken=st.sets(st.from_regex(DAGSTER_NAME, fullmatch=True)))
def test_group_names_are_valid_unique_and_keep_a_valid_stem(stems: list[str], taken: set[str]) -> None:
    used = set(taken)
    for stem in stems:  # as load_definitions names the broken files one after another
        path = Path("mixes") / f"{stem}.yaml"
        name = invalid_mix_group(path, used)
        assert DAGSTER_NAME.fullmatch(name), (stem, name)
        assert name not in used
        assert name == invalid_mix_group(path, used), "deterministic"
        if DAGSTER_NAME.fullmatch(path.stem) and path.stem not in used:
            assert name == path.stem
        used.add(name)


def test_dagster_accepts_the_stand_in_of_any_file_name(tmp_path: Path) -> None:
    taken: set[str] = set()
    assets, checks = [], []
    for stem in ("2024 mix", "naïve-mix", "", "mix", "mix"):
        group = invalid_mix_group(tmp_path / f"{stem}.yaml", taken)
        taken.add(group)
        asset, check = invalid_mix_assets(tmp_path / f"{stem}.yaml", group, "e")
        assets.append(asset)
        checks.append(check)
    defs = dg.Definitions(assets=assets, asset_checks=checks)
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    assert {graph.get(k).group_name for k in graph.get_all_asset_keys()} == taken
    assert len(taken) == 5


def _run(path: Path, error: str) -> tuple[str, dg.AssetCheckEvaluation]:
    """Materialize the stand-in of ``path`` (it always fails): its failure's message, then its check's evaluation."""
    asset, check = invalid_mix_assets(path, "broken", error)
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([asset], instance=instance, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    info = failure.step_failure_data.error
    assert info is not None
    cause = info.cause
    assert cause is not None
    checked = dg.materialize(
        [asset, check], selection=dg.AssetSelection.checks_for_assets(asset), instance=instance, raise_on_error=False
    )
    (evaluation,) = checked.get_asset_check_evaluations()
    return cause.message, evaluation


def test_the_error_shows_until_the_file_is_fixed_then_the_check_passes(tiny_mix_path: Path) -> None:
    good = tiny_mix_path.read_text()
    tiny_mix_path.write_text(good.replace("notes: 0.75", "notes: .nan"))
    with pytest.raises(MixError) as raised:
        load_mix(tiny_mix_path)
    error = str(raised.value)
    assert "\n" not in error and str(tiny_mix_path) in error

    asset, _check = invalid_mix_assets(tiny_mix_path, "broken", error)
    (spec,) = asset.specs
    assert spec.key == dg.AssetKey(["broken", "mix_file"]) and spec.group_name == "broken"
    assert error in (spec.description or "") and spec.metadata["error"] == error
    assert spec.metadata["mix_file"] == dg.MetadataValue.path(str(tiny_mix_path))

    message, evaluation = _run(tiny_mix_path, error)
    assert error in message and "reload the code location" in message
    assert not evaluation.passed and evaluation.description == error
    assert evaluation.metadata["error"].value == error

    tiny_mix_path.write_text(good)  # fixed: the definitions are stale until reloaded, and say so
    message, evaluation = _run(tiny_mix_path, error)
    assert error not in message and "the file is valid now; reload the code location" in message
    assert evaluation.passed and "valid now" in (evaluation.description or "")
