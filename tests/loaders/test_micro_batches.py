"""Unequal micro-batch counts per DP rank (``balance.micro_batches: unequal``): balance within a step, every
sequence of a step read once, exact resume, the mix file's option reaching the loader."""

from __future__ import annotations

import itertools
import json
import shutil
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.manifest import write_manifest
from contract.shards import ShardSet
from loaders import Balance, PackedDataset, World, varlen
from loaders.balance import assign_ranks, assign_unequal, dp_imbalance
from loaders.state import StateError
from mixing import MixError
from mixing.mixfile.mix import parse_mix


@settings(max_examples=80)
@given(st.integers(1, 6), st.integers(0, 12), st.integers(0, 2**31 - 1))
def test_every_rank_gets_one_and_the_heaviest_stays_within_the_list_bound(dp: int, extra: int, seed: int) -> None:
    costs = np.random.default_rng(seed).pareto(1.2, dp + extra) + 0.01
    ranks = assign_unequal(costs, dp)
    loads = np.bincount(ranks, weights=costs, minlength=dp)
    assert ranks.min() >= 0 and ranks.max() < dp
    assert np.bincount(ranks, minlength=dp).min() >= 1
    assert loads.max() <= loads.mean() + costs.max() + 1e-9  # list scheduling's bound, kept by the moves
    assert np.array_equal(ranks, assign_unequal(costs, dp))  # deterministic


def test_unequal_counts_balance_what_equal_counts_cannot() -> None:
    costs = np.array([4.0, 1, 1, 1, 1, 1, 1, 1])  # one long sequence among short ones, two ranks
    equal, unequal = assign_ranks(costs, 2), assign_unequal(costs, 2)
    assert dp_imbalance(costs, equal, 2) == pytest.approx(7 / 5.5)
    assert dp_imbalance(costs, unequal, 2) == pytest.approx(6 / 5.5)


def test_too_few_sequences_for_the_ranks_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one"):
        assign_unequal(np.ones(3), 4)


def items(ds: PackedDataset, n: int | None = None) -> list[tuple[int, int, int]]:
    return [(int(it["step"]), int(it["slot"]), int(it["sequence"])) for it in itertools.islice(ds, n)]


@pytest.mark.parametrize("dp", [3, 4])
def test_every_step_is_read_once_over_ranks_with_any_dp(tiny_build: Path, dp: int) -> None:
    full = ShardSet(tiny_build / "shards")  # 4 sequences per step: dp=3 only works with unequal counts
    per_step: dict[int, list[int]] = defaultdict(list)
    for r in range(dp):
        ds = PackedDataset(tiny_build, world=World(r, dp), balance=Balance(seed=5, micro_batches="unequal"))
        expected = len(ds)
        got = items(ds)
        assert len(got) == expected and len(ds) == 0
        for t, _, s in got:
            per_step[t].append(s)
    assert all(sorted(v) == np.flatnonzero(full.steps == t).tolist() for t, v in per_step.items())
    assert len(per_step) == full.steps.max() + 1
    with pytest.raises(ValueError, match="not divisible"):
        PackedDataset(tiny_build, world=World(0, 3))


@pytest.mark.parametrize("stop", [1, 2, 5, 9])
def test_resume_inside_a_step_gives_the_uninterrupted_stream(tiny_build: Path, stop: int) -> None:
    def make() -> PackedDataset:
        return PackedDataset(tiny_build, world=World(0, 3), balance=Balance(seed=5, micro_batches="unequal"))

    reference = items(make())
    first = make()
    head = items(first, stop)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + items(resumed) == reference
    if first.state_dict()["consumed"]:
        with pytest.raises(StateError, match="micro-batches"):
            PackedDataset(tiny_build, world=World(0, 2), balance=Balance(seed=5)).load_state_dict(first.state_dict())


def test_the_mix_files_option_reaches_the_loader(tiny_build: Path, tmp_path: Path) -> None:
    copy = tmp_path / "build"
    shutil.copytree(tiny_build / "shards", copy / "shards")
    manifest = json.loads((copy / "shards" / "manifest.json").read_text())
    assert manifest["micro_batches"] == "equal"  # the default, recorded by the build
    manifest["micro_batches"] = "unequal"
    write_manifest(copy / "shards", manifest)
    assert PackedDataset(copy, world=World(0, 3)).settings.balance.micro_batches == "unequal"
    equal = PackedDataset(copy, world=World(0, 2), balance=Balance(micro_batches="equal"))
    assert equal.settings.balance.micro_batches == "equal"


def test_mix_file_names_a_bad_micro_batches_value() -> None:
    text = "name: m\nsequence: {length: 8, global_batch: 2}\nsources:\n  a: {uri: x}\n"
    text += "curriculum:\n  - {phase: p, steps: 1, mixture: {a: 1}}\nbalance:\n  micro_batches: sometimes\n"
    assert parse_mix(text.replace("sometimes", "unequal"), "m.yaml").balance.micro_batches == "unequal"
    with pytest.raises(MixError, match=r"m.yaml:8: balance.micro_batches"):
        parse_mix(text, "m.yaml")


def budget_build(tiny_build: Path, tmp_path: Path, max_tokens: int) -> Path:
    copy = tmp_path / "budget"
    shutil.copytree(tiny_build / "shards", copy / "shards")
    manifest = json.loads((copy / "shards" / "manifest.json").read_text())
    manifest.update(micro_batches="unequal", max_tokens=max_tokens)
    write_manifest(copy / "shards", manifest)
    return copy


def test_a_token_budget_caps_every_ranks_share_of_a_step(tiny_build: Path, tmp_path: Path) -> None:
    build = budget_build(tiny_build, tmp_path, 2 * 64)  # S = 64, 4 sequences per step over 3 ranks
    full = ShardSet(build / "shards")
    per_step: dict[int, list[int]] = defaultdict(list)
    for r in range(3):
        ds = PackedDataset(build, world=World(r, 3), balance=Balance(seed=5))
        for step, group in itertools.groupby(items(ds), key=lambda x: x[0]):
            seqs = [s for *_, s in group]
            assert int(full.seq_tokens[seqs].sum()) <= 128  # the budget holds on every rank and step
            per_step[step] += seqs
    assert all(sorted(v) == np.flatnonzero(full.steps == t).tolist() for t, v in per_step.items())
    with pytest.raises(ValueError, match="max_tokens 128 cannot hold an equal share"):
        PackedDataset(build, world=World(0, 1))  # 4 sequences of 64 tokens on one rank


def test_budget_falls_back_to_near_equal_counts_when_the_greedy_start_cannot_meet_it() -> None:
    costs, tokens = np.array([9.0, 1, 1, 1, 1, 1]), np.full(6, 10)
    ranks = assign_unequal(costs, 2, tokens=tokens, max_tokens=30)  # the heavy rank would want 1, the other 5
    assert np.bincount(ranks).tolist() == [3, 3]
    assert np.bincount(assign_unequal(costs, 2), minlength=2).tolist() == [1, 5]


def test_varlen_micro_batches_keep_every_real_token_and_boundary(tiny_build: Path, tmp_path: Path) -> None:
    build = budget_build(tiny_build, tmp_path, 2 * 64)
    ds = PackedDataset(build, world=World(1, 3), balance=Balance(seed=5))
    whole = PackedDataset(build, world=World(1, 3), balance=Balance(seed=5))
    for batch in varlen.by_step(ds):
        parts = [whole.item(s) for s in batch["sequences"]]
        n = [int(p["num_tokens"]) for p in parts]
        assert batch["num_tokens"] == sum(n) <= 128
        assert torch.equal(batch["input_ids"], torch.cat([p["input_ids"][:k] for p, k in zip(parts, n, strict=True)]))
        assert torch.equal(batch["labels"], torch.cat([p["labels"][:k] for p, k in zip(parts, n, strict=True)]))
        cu = batch["cu_seqlens"].tolist()
        assert cu[0] == 0 and cu[-1] == sum(n) and cu == sorted(set(cu))
        ends = np.array(cu[1:]) - 1
        assert (batch["labels"].numpy()[ends] == -100).all()  # no label crosses a document boundary
        assert (batch["position_ids"].numpy()[cu[:-1]] == 0).all()  # every document starts at position 0
    with pytest.raises(ValueError, match="whole-sequence"):
        varlen.concat(list(itertools.islice(PackedDataset(build, world=World(0, 3, 0, 2)), 1)))
