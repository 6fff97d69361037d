"""Refinement of regrouped windows: a permutation inside each window, never above its balance bound, windows
closer to the build's mixture; chained windows resume exactly from the context a state carries."""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.manifest import write_manifest
from loaders import Balance, PackedDataset, PackedLoader, StateError, World
from loaders.balance import regroup_window
from loaders.refinement import refine_steps
from tests.conftest import ROOT, TINY_MIX, write_tiny_sources


def synthetic(rng: np.random.Generator, steps: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequences of a long-context build, step by step: 40% full-length pieces of one source (cost 1.7) and
    packs of short documents of four others in varying proportions (cost 1.0–1.05, by the packs' lengths)."""
    n = steps * size
    heavy = (np.arange(n) % size) < round(0.4 * size)
    src = np.zeros((n, 5))
    src[heavy, 0] = 32768
    src[~heavy, 1:] = rng.dirichlet([1.5] * 4, int((~heavy).sum())) * 32768
    cost = np.where(heavy, 1.7, 1.0 + 0.05 * rng.random(n))
    return cost, src


def windows_error(comps: np.ndarray, target: np.ndarray, period: int) -> float:
    """max over full ``period``-step windows and sources of |share − target share|."""
    worst = 0.0
    for e in range(period, len(comps) + 1):
        got, want = comps[e - period : e].sum(0), target[e - period : e].sum(0)
        worst = max(worst, float(np.abs(got / got.sum() - want / want.sum()).max()))
    return worst


def step_balance(costs: np.ndarray, step_of: np.ndarray) -> np.ndarray:
    steps = int(step_of.max()) + 1
    top = np.array([costs[step_of == g].max() for g in range(steps)])
    return top / (np.bincount(step_of, weights=costs) / np.bincount(step_of))


@settings(max_examples=25)
@given(st.integers(2, 12), st.integers(2, 8), st.integers(0, 5), st.integers(0, 2**31 - 1))
def test_a_permutation_inside_the_window_within_its_balance_bound(steps: int, size: int, k: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    costs, src = synthetic(rng, steps, size)
    regrouped = regroup_window(costs, src, steps, period=5)
    context = rng.integers(0, 30000, (min(k, 4), src.shape[1]))
    target = np.concatenate([context, src.reshape(steps, size, -1).sum(1)])
    refined = refine_steps(costs, src, regrouped, context, target, period=5, slack=1.1)
    assert np.bincount(refined, minlength=steps).tolist() == [size] * steps  # step sizes kept
    bound = np.maximum(step_balance(costs, regrouped).max(), 1.1)
    assert (step_balance(costs, refined) <= bound + 1e-9).all()  # no step above max(any before, slack)
    assert np.array_equal(refined, refine_steps(costs, src, regrouped, context, target, period=5, slack=1.1))


def test_windows_move_toward_the_build_mixture() -> None:
    rng = np.random.default_rng(0)
    size, period, unit, units = 16, 10, 20, 6
    costs, src = synthetic(rng, unit * units, size)
    build = src.reshape(-1, size, src.shape[1]).sum(1)
    plain: list[np.ndarray] = []
    refined: list[np.ndarray] = []
    for b in range(units):
        sl = slice(b * unit * size, (b + 1) * unit * size)
        step_of = regroup_window(costs[sl], src[sl], unit, period=period)
        plain.append(np.stack([src[sl][step_of == g].sum(0) for g in range(unit)]))
        done = np.concatenate(refined) if refined else np.zeros((0, src.shape[1]))
        context = done[len(done) - min(period - 1, len(done)) :]
        target = build[b * unit - len(context) : (b + 1) * unit]
        step_of = refine_steps(costs[sl], src[sl], step_of, context, target, period)
        refined.append(np.stack([src[sl][step_of == g].sum(0) for g in range(unit)]))
    before = windows_error(np.concatenate(plain), build, period)
    after = windows_error(np.concatenate(refined), build, period)
    assert after < 0.5 * before, (before, after)


def items(ds, n: int | None = None) -> list[tuple[int, int, int]]:
    return [(int(i["step"]), int(i["slot"]), int(i["sequence"])) for i in itertools.islice(ds, n)]


def make(build: Path, slack: float | None = None) -> PackedDataset:
    return PackedDataset(build, world=World(0, 2), balance=Balance(seed=3, window=2, period=2, slack=slack))


@pytest.mark.parametrize("stop", [0, 3, 6, 9, 11, 15])
def test_resume_from_the_states_context_equals_the_uninterrupted_stream(tiny_build: Path, stop: int) -> None:
    reference = items(make(tiny_build))
    first = make(tiny_build)
    head = items(first, stop)
    state = first.state_dict()
    assert state["slack"] > 0 and (state["context"] is not None or state["step"] >= 8)
    resumed = make(tiny_build)
    resumed.load_state_dict(state)  # a fresh planner: the context replaces the windows before
    assert head + items(resumed) == reference
    loader = PackedLoader(make(tiny_build), num_workers=2)
    loader.load_state_dict(state)
    assert [(int(i["step"]), int(i["slot"]), int(i["sequence"])) for i in loader] == reference[stop:]


def test_refinement_changes_steps_only_with_period_and_window(tiny_build: Path) -> None:
    assert PackedDataset(tiny_build, world=World(0, 2), balance=Balance(window=2, period=0)).planner.slack == 0
    assert PackedDataset(tiny_build, world=World(0, 2), balance=Balance(window=1, period=2)).planner.slack == 0
    on = [
        s
        for r in range(2)
        for *_, s in items(PackedDataset(tiny_build, world=World(r, 2), balance=Balance(window=2, period=2)))
    ]
    assert sorted(on) == list(range(len(make(tiny_build).shards)))  # every sequence once over the ranks


def test_a_foreign_or_older_state_is_refused(tiny_build: Path) -> None:
    ds = make(tiny_build)
    items(ds, 9)
    state = ds.state_dict()
    assert state["context"], "this point should lie after the first window"
    bad = dict(state, context=[[v + 1 for v in row] for row in state["context"]])
    warm = make(tiny_build)
    items(warm)  # its planner knows every window's context
    with pytest.raises(StateError, match="context"):
        warm.load_state_dict(bad)
    with pytest.raises(StateError, match="context"):
        make(tiny_build).load_state_dict(dict(state, context=[[1, 2, 3]]))
    older = {k: v for k, v in state.items() if k not in ("slack", "context")} | {"version": 2}  # before refinement
    with pytest.raises(StateError, match="slack 0"):
        make(tiny_build).load_state_dict(older)
    make(tiny_build, slack=0).load_state_dict(older)  # resumes on the layout it was saved with


def test_the_mix_files_regroup_is_the_loaders_default(tiny_build: Path, tmp_path: Path) -> None:
    copy = tmp_path / "build"
    shutil.copytree(tiny_build / "shards", copy / "shards")
    manifest = json.loads((copy / "shards" / "manifest.json").read_text())
    assert manifest["regroup"] is None  # the tiny mix has none: steps exactly as built
    default = PackedDataset(tiny_build, world=World(0, 2)).settings.balance
    assert (default.window, default.period) == (1, 0)
    manifest["regroup"] = {"window": 2, "period": 2, "slack": 1.2}
    write_manifest(copy / "shards", manifest)
    ds = PackedDataset(copy, world=World(0, 2))
    assert (ds.settings.balance.window, ds.settings.balance.period, ds.planner.slack) == (2, 2, 1.2)
    assert PackedDataset(copy, world=World(0, 2), balance=Balance(window=1)).planner.slack == 0  # arguments override it


def test_a_build_with_balance_options_reaches_the_loader(tmp_path: Path) -> None:
    write_tiny_sources(tmp_path / "data")
    mix = TINY_MIX.format(root=tmp_path / "data").replace("steps: 3", "steps: 4").replace("steps: 5", "steps: 6")
    mix += "balance: {micro_batches: unequal, regroup: {window: 2, period: 2}}\n"
    (tmp_path / "m.yaml").write_text(mix)
    cli = [sys.executable, "-m", "pipelines.cli", "build", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "b")]
    subprocess.run(cli, check=True, cwd=ROOT, capture_output=True)
    manifest = json.loads((tmp_path / "b" / "shards" / "manifest.json").read_text())
    assert manifest["regroup"] == {"window": 2, "period": 2, "slack": 1.15}
    assert manifest["micro_batches"] == "unequal"
    ranks = [PackedDataset(tmp_path / "b", world=World(r, 3)) for r in range(3)]  # 4 sequences per step over 3 ranks
    settings = [(d.settings.balance, d.planner.slack) for d in ranks]
    assert all((b.window, b.period, b.micro_batches, slack) == (2, 2, "unequal", 1.15) for b, slack in settings)
    seen = sorted(s for d in ranks for *_, s in items(d))
    assert seen == list(range(len(ranks[0].shards)))
    (tmp_path / "m.yaml").write_text(mix.replace("steps: 4", "steps: 5"))
    bad = subprocess.run(cli, cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and "curriculum[0].steps" in bad.stderr and "4 or 6" in bad.stderr


def test_a_loader_with_workers_saves_states_without_refining_in_the_main_process(tiny_build: Path) -> None:
    reference = make(tiny_build)
    loader = PackedLoader(make(tiny_build), num_workers=2)
    got = []
    for k, item in enumerate(loader):
        assert "_planner_contexts" not in item  # what the workers pass along never reaches the trainer
        got.append(item)
        if k == 10:
            break
    state = loader.state_dict()
    assert isinstance(loader.dataset, PackedDataset)  # DataLoader's stub types .dataset as any torch Dataset
    assert not loader.dataset.planner._arranged  # the contexts came from the workers
    items(reference, 11)
    assert state == reference.state_dict()  # the same state an in-process pass computes itself
