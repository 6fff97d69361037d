"""DP balance: equal counts, never worse than plain LPT, near the optimum; regrouping keeps every sequence."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.balance import assign_ranks, dp_imbalance, regroup_bounds, regroup_window, tail_classes, template_slots


def lpt_equal_count(costs: np.ndarray, dp: int) -> float:
    per, loads, counts = len(costs) // dp, np.zeros(dp), np.zeros(dp, int)
    for i in np.argsort(-costs, kind="stable"):
        r = min((r for r in range(dp) if counts[r] < per), key=lambda r: loads[r])
        loads[r] += costs[i]
        counts[r] += 1
    return loads.max() / loads.mean()


@settings(max_examples=60)
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


@settings(max_examples=40)
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


@settings(max_examples=30)
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
    # 40% heavy (source 1) in every build step; three windows regrouped independently, as the planner does
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


@settings(max_examples=40)
@given(st.integers(0, 4), st.integers(1, 12), st.integers(0, 11))
def test_template_repeats_its_first_positions_in_the_partial_block(m: int, period: int, r: int) -> None:
    r %= period
    steps = m * period + r
    if steps == 0:
        return
    slots = template_slots(steps, period, tail=r)
    assert sorted(slots.tolist()) == list(range(steps))  # a bijection of runs onto steps
    cls = ((np.arange(steps) + 0.5) * period // steps).astype(int)  # class of each run, heaviest first
    cls_at = np.empty(steps, dtype=int)
    cls_at[slots] = cls
    for a in range(steps - period + 1):  # any `period` consecutive steps hold each class once
        assert sorted(cls_at[a : a + period].tolist()) == list(range(period))
    if m:  # the layout is periodic, tail included
        assert (cls_at[: steps - period] == cls_at[period:]).all()
    assert len(tail_classes(period, r)) == r


@settings(max_examples=40)
@given(st.integers(0, 50), st.integers(1, 80), st.integers(1, 12), st.integers(0, 12))
def test_regroup_bounds_cover_the_phase_and_absorb_a_short_tail(
    first: int, length: int, window: int, period: int
) -> None:
    starts = regroup_bounds(first, first + length, window, period)
    assert starts[0] == first and starts == sorted(set(starts)) and starts[-1] < first + length
    sizes = np.diff([*starts, first + length])
    assert (sizes[:-1] == window).all()
    if period and window >= period and len(starts) > 1:
        assert sizes[-1] >= period


def phase_stream(steps: int, size: int, seed: int, merge_tail: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per training step tokens per source of a synthetic phase regrouped window by window (window = period
    = 10) as the planner does, and the build's tokens per source. Long-tailed (Pareto) costs, the same
    profile in every build step; the source follows the cost band (heaviest = books-like)."""
    rng = np.random.default_rng(seed)
    base = (1 - (np.arange(size) + 0.5) / size) ** (-1 / 1.5)
    costs = np.stack([rng.permutation(base * (1 + 0.01 * rng.random(size))) for _ in range(steps)])
    src = np.zeros((steps, size, 4))
    np.put_along_axis(src, np.digitize(costs, [1.3, 2.0, 3.5])[..., None], np.sqrt(costs)[..., None], axis=2)
    starts = regroup_bounds(0, steps, 10, 10) if merge_tail else list(range(0, steps, 10))
    out = []
    for a, b in itertools.pairwise([*starts, steps]):
        flat = src[a:b].reshape(-1, 4)
        tail = steps % 10 if merge_tail else 0
        new = regroup_window(costs[a:b].ravel(), flat, b - a, period=10, tail=tail)
        out += [flat[new == k].sum(axis=0) for k in range(b - a)]
    return np.array(out), src.reshape(-1, 4).sum(axis=0)


def worst_window(per: np.ndarray, build: np.ndarray) -> float:
    want = build / build.sum()
    return max(float(np.abs(per[a : a + 10].sum(0) / per[a : a + 10].sum() - want).max()) for a in range(len(per) - 9))


@pytest.mark.parametrize("steps", [64, 53, 37, 15])
def test_partial_block_keeps_every_window_near_the_mixture(steps: int) -> None:
    per, build = phase_stream(steps, 16, 0, merge_tail=True)
    assert np.allclose(per.sum(axis=0), build)  # nothing lost or repeated
    # homogeneous-cost steps cannot reach the build's share exactly around a partial block (see
    # loaders.balance); the tail window used to drift by 0.15-0.19 here, the merged tail stays within 0.05
    assert worst_window(per, build) <= 0.05
    old, _ = phase_stream(steps, 16, 0, merge_tail=False)  # the tail as its own short window
    assert worst_window(old, build) > 0.1
