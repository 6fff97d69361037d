"""``loaders.stream``: ``stream_compositions`` gives the tokens of each source in each training step (int64
[steps, sources], the manifest's order) from the segment index alone: each source's packed tokens (the
manifest's ``per_source``) and each phase's are conserved whatever the balance, the build's own steps with
``window == 1``, what the DP ranks' shares hold on any world; ``settings_planner`` and ``stream_planner``
are the planner a ``PackedDataset`` with those settings reads with, each setting reaching its place."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.shards import ShardSet
from loaders import Balance, PackedDataset, Reading, World
from loaders.config import BalanceSettings
from loaders.stream import settings_planner, stream_compositions, stream_planner

balances = st.builds(
    Balance,
    seed=st.none() | st.integers(0, 2**31),
    window=st.none() | st.integers(1, 5),
    period=st.none() | st.integers(0, 3),
    slack=st.none() | st.sampled_from([0.0, 1.15, 1.5]),
    micro_batches=st.none() | st.sampled_from(["equal", "unequal"]),
    layout=st.none() | st.sampled_from([0, 1]),
    edges=st.none() | st.integers(0, 2),
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def shards(tiny_build: Path) -> ShardSet:
    return ShardSet(tiny_build / "shards")


def per_sequence(shards: ShardSet) -> np.ndarray:
    """Tokens of each source in each build sequence, read from the shards themselves (not the index)."""
    n = len(shards.manifest.sources or ())
    out = np.zeros((len(shards), n), dtype=np.int64)
    for i in range(len(shards)):
        segs = shards.sequence(i).segments
        np.add.at(out[i], segs[:, 0], segs[:, 3])
    return out


@settings(max_examples=30)
@given(balances)
def test_every_sources_and_every_phases_tokens_are_conserved(shards: ShardSet, balance: Balance) -> None:
    got = stream_compositions(stream_planner(shards, balance))
    m = shards.manifest
    names = list(m.sources or ())
    assert got.dtype == np.int64 and got.shape == (m.steps, len(names)) and (got >= 0).all()
    assert m.per_source is not None
    assert got.sum(axis=0).tolist() == [m.per_source[s].tokens_packed for s in names]
    built = np.zeros_like(got)
    np.add.at(built, shards.steps, per_sequence(shards))
    for ph in m.phases or ():  # no sequence leaves its phase: each phase's stream holds its build steps' tokens
        span = slice(ph.first_step, ph.first_step + ph.steps)
        assert (got[span].sum(axis=0) == built[span].sum(axis=0)).all(), ph.phase
    if stream_planner(shards, balance).window == 1:
        assert np.array_equal(got, built)  # the build's own steps


@settings(max_examples=15)
@given(balances, st.integers(0, 2**31))
def test_the_stream_is_what_the_ranks_shares_hold_on_any_world_and_seed(
    shards: ShardSet, balance: Balance, seed: int
) -> None:
    planner = stream_planner(shards, balance)
    got = stream_compositions(planner)
    tokens = per_sequence(shards)
    reseeded = stream_planner(shards, dataclasses.replace(balance, seed=seed))
    assert np.array_equal(stream_compositions(reseeded), got)  # the seed deals a step; it does not make it
    for dp in (1, 2, 4):
        for t in range(planner.steps):
            shares = planner.assignment(t, dp)
            assert (sum(tokens[s].sum(axis=0) for s in shares) == got[t]).all(), (dp, t)


@settings(max_examples=15)
@given(balances)
def test_stream_planner_is_the_planner_a_dataset_reads_with(shards: ShardSet, cache: Path, balance: Balance) -> None:
    ds = PackedDataset(shards.dir, world=World(0, 2), balance=balance, reading=Reading(cache_dir=cache))
    planner = stream_planner(shards, balance)
    for t in range(planner.steps):
        assert np.array_equal(planner.step_sequences(t), ds.planner.step_sequences(t))
        assert all(
            np.array_equal(a, b) for a, b in zip(planner.assignment(t, 2), ds.planner.assignment(t, 2), strict=True)
        )
    state = ds.state_dict()
    assert (planner.seed, planner.window, planner.period) == (state["seed"], state["window"], state["period"])


@given(
    st.integers(0, 2**31),
    st.integers(1, 5),
    st.integers(0, 3),
    st.sampled_from([0.0, 1.15]),
    st.sampled_from(["equal", "unequal"]),
    st.sampled_from([0, 1]),
    st.integers(0, 3),
)
@settings(max_examples=30)
def test_each_setting_reaches_its_place_in_the_planner(
    shards: ShardSet, seed: int, window: int, period: int, slack: float, micro: str, layout: int, edges: int
) -> None:
    b = BalanceSettings(seed, window, period, slack, micro, layout, edges)
    planner = settings_planner(shards, b)
    assert (planner.seed, planner.window, planner.period, planner.micro_batches) == (seed, window, period, micro)
    # the tiny build has a phase boundary: with refinement on, the slack and edges are kept as asked
    refined = period > 0 and window > 1
    assert planner.slack == (slack if refined else 0.0)
    assert planner.edge_windows == (edges if refined and slack else 0)
    assert planner.layout == (layout if refined else 0)
