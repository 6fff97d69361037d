"""One stage table: the Dagster asset graph, the runs of ``weir build``, the stages ``weir plan --compute`` runs
and the automated stages all follow :data:`mixing.stages.STAGES`, and a stage added to it appears in each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from assets import mix_assets
from mixing import Mix, load_mix, stages
from mixing.stages import STAGES, Stage
from pipelines import build
from pipelines.automation import automated
from pipelines.freshness import compute_stats

Run = tuple[str, str | None]


def graph(mix: Mix) -> list[tuple[str, list[str] | None, list[str]]]:
    """(stage, partition keys or None, its deps' stages) of each asset of ``mix``, in the factory's order."""
    found = []
    for a in mix_assets(mix):
        (key,) = a.keys
        assert key.path[:-1] == [mix.name]
        parts = list(a.partitions_def.get_partition_keys()) if a.partitions_def else None
        found.append((key.path[-1], parts, sorted(d.path[-1] for d in a.asset_deps[key])))
    return found


def expected_runs(mix: Mix, table: tuple[Stage, ...]) -> list[Run]:
    return [(s.name, p) for s in table for p in (sorted(mix.sources) if s.per_source else [None])]


def build_runs(mix: Mix, out: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Run], list[str]]:
    """What ``weir build``'s in-process build materializes, in order (nothing runs), and the lines it says."""
    runs: list[Run] = []

    def materialize(_assets: object, selection: list[dg.AssetKey], partition_key: str | None, **_kw: Any) -> None:
        (key,) = selection
        runs.append((key.path[-1], partition_key))

    monkeypatch.setattr(dg, "materialize", materialize)
    said: list[str] = []
    build.build_mix(mix, out, say=said.append)
    return runs, said


def compute_runs(mix: Mix, root: Path, monkeypatch: pytest.MonkeyPatch) -> list[Run]:
    """The stage runs of ``weir plan --compute`` (:func:`pipelines.freshness.compute_stats`), in order."""
    runs: list[Run] = []

    def run(self: Stage, _mix: Mix, _layout: object, source: str | None = None, _options: object = None) -> None:
        runs.append((self.name, source))

    monkeypatch.setattr(Stage, "run", run)
    compute_stats(mix, root, None, lambda _s: None)
    return runs


def test_the_table_names_each_stage_once_after_its_deps() -> None:
    seen: set[str] = set()
    for s in STAGES:
        assert s.name not in seen and set(s.deps) <= seen, s
        seen.add(s.name)
    assert stages.stages_until("length_stats")[-1].name == "length_stats"


def test_assets_build_and_plan_compute_follow_the_table(
    tiny_mix_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mix = load_mix(tiny_mix_path)
    assert graph(mix) == [(s.name, sorted(mix.sources) if s.per_source else None, sorted(s.deps)) for s in STAGES], (
        "the asset graph is the table: keys in its order, per-source stages partitioned by source, its deps"
    )

    runs, said = build_runs(mix, tmp_path / "out", monkeypatch)
    assert runs == expected_runs(mix, STAGES)
    assert said == [f"  {s}" + (f" [{p}]" if p else "") for s, p in runs]

    until = [s.name for s in STAGES].index("length_stats") + 1
    assert compute_runs(mix, tmp_path / "stats", monkeypatch) == expected_runs(mix, STAGES[:until])

    chained = {s.key.path[-1] for a in automated(mix_assets(mix)) for s in a.specs if s.automation_condition}
    assert chained == {s.name for s in STAGES if s.deps}


def test_a_stage_added_to_the_table_appears_everywhere(
    tiny_mix_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mix = load_mix(tiny_mix_path)
    extra = Stage("dedup", per_source=True, deps=("documents",), fn=lambda *_a: None)
    at = [s.name for s in STAGES].index("documents") + 1
    table = (*STAGES[:at], extra, *STAGES[at:])
    monkeypatch.setattr(stages, "STAGES", table)

    with pytest.raises(LookupError, match="dedup"):  # the graph is never defined without one of its stages
        mix_assets(mix)

    monkeypatch.setattr(build, "mix_assets", lambda _mix: [])
    runs, _said = build_runs(mix, tmp_path / "out", monkeypatch)
    assert runs == expected_runs(mix, table)
    assert ("dedup", "qa") in runs and runs.index(("dedup", "notes")) > runs.index(("documents", "qa"))
    assert ("dedup", "notes") in compute_runs(mix, tmp_path / "stats", monkeypatch)  # before length_stats

    asset = dg.asset(key=dg.AssetKey([mix.name, "dedup"]))(lambda: None)
    ((spec,),) = (a.specs for a in automated([asset]))
    assert spec.automation_condition is not None
