"""DP balance: equal counts, never worse than plain LPT, near the optimum; regrouping keeps every sequence."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.balance import assign_ranks, dp_imbalance, regroup_window


def lpt_equal_count(costs: np.ndarray, dp: int) -> float:
    per, loads, counts = len(costs) // dp, np.zeros(dp), np.zeros(dp, int)
    for i in np.argsort(-costs, kind="stable"):
        r = min((r for r in range(dp) if counts[r] < per), key=lambda r: loads[r])
        loads[r] += costs[i]
        counts[r] += 1
    return loads.max() / loads.mean()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_equal_counts_and_no_worse_than_lpt(dp: int, per: int, seed: int) -> None:
    costs = np.random.default_rng(seed).pareto(1.2, dp * per) + 0.01
    ranks = assign_ranks(costs, dp)
    assert np.bincount(ranks, minlength=dp).tolist() == [per] * dp
    assert dp_imbalance(costs, ranks, dp) <= lpt_equal_count(costs, dp) + 1e-9


def test_close_to_the_optimum_on_small_cases() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        costs = rng.pareto(1.0, 8) + 0.1
        best = min(
            max(costs[list(a)].sum(), costs[[i for i in range(8) if i not in a]].sum())
            for a in itertools.combinations(range(8), 4)
        )
        ranks = assign_ranks(costs, 2)
        got = np.bincount(ranks, weights=costs, minlength=2).max()
        assert got <= best * 1.05


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 8), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_regroup_is_an_equal_partition_of_similar_costs(steps: int, size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    costs = rng.pareto(1.0, steps * size)
    new = regroup_window(costs, rng.integers(0, 100, (steps * size, 3)), steps, band=0.0)
    assert np.bincount(new, minlength=steps).tolist() == [size] * steps
    # steps hold runs of the cost order: no step's range overlaps another's
    ranges = sorted((costs[new == s].min(), costs[new == s].max()) for s in range(steps))
    assert all(hi_a <= lo_b for (_, hi_a), (lo_b, _) in itertools.pairwise(ranges))


def test_regroup_lowers_imbalance_with_one_sequence_per_rank() -> None:
    rng = np.random.default_rng(1)
    steps, dp = 8, 16
    costs = np.where(rng.random(steps * dp) < 0.1, 100.0, 1.0) + rng.random(steps * dp)
    before = np.mean([c.max() / c.mean() for c in costs.reshape(steps, dp)])
    new = regroup_window(costs, np.ones((len(costs), 1)), steps)
    after = np.mean([costs[new == s].max() / costs[new == s].mean() for s in range(steps)])
    assert after < 1.3 < before


def test_regroup_order_tracks_the_mixture() -> None:
    # two sources, cost ∝ source: steps of one source only, placed alternately to track a 50/50 build
    costs = np.tile([1.0, 10.0], 8)
    src = np.stack([costs == 1.0, costs == 10.0], axis=1).astype(float)
    new = regroup_window(costs, src, 4)
    heavy_steps = sorted(set(new[costs == 10.0].tolist()))
    assert heavy_steps in ([0, 2], [1, 3])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.integers(2, 6), st.integers(1, 5), st.integers(0, 2**31 - 1))
def test_period_template_repeats_in_every_block(blocks: int, period: int, size: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps = blocks * period
    costs = rng.pareto(1.0, steps * size)
    new = regroup_window(costs, np.ones((len(costs), 1)), steps, band=0.0, period=period)
    assert np.bincount(new, minlength=steps).tolist() == [size] * steps
    lo = np.array([costs[new == s].min() for s in range(steps)]).reshape(blocks, period)
    hi = np.array([costs[new == s].max() for s in range(steps)]).reshape(blocks, period)
    # heaviest first inside a block, and position p of any block is at least as heavy as position p+1 of any
    assert (lo[:, :-1] >= hi[:, 1:].max(axis=0)).all()


def test_period_template_keeps_every_window_on_the_mixture() -> None:
    # 40% heavy (source 1) in every build step; three windows regrouped independently, as the schedule does
    period = 10  # five sequences per step
    base = np.array([10.0] * 2 + [1.0] * 3)
    stream = []
    for w in range(3):
        costs = np.tile(np.roll(base, w), period)
        src = np.stack([costs == 1.0, costs == 10.0], axis=1).astype(float)
        new = regroup_window(costs, src, period, period=period)
        stream += [src[new == s].sum(axis=0) for s in range(period)]
    per = np.array(stream)
    assert {tuple(per[s]) for s in range(len(per))} == {(5.0, 0.0), (0.0, 5.0)}  # steps of one source only
    for a in range(len(per) - period + 1):
        share = per[a : a + period].sum(axis=0) / per[a : a + period].sum()
        assert share[1] == 0.4
