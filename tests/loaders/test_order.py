"""loaders.order: a phase's template order matched to the steps before it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders import order as order_module
from loaders.balance import regroup_window, tail_classes, template_order
from loaders.order import first_block, match_order


def boundary_error(
    order: list[int], classes: np.ndarray, build: np.ndarray, before: np.ndarray, before_build: np.ndarray
) -> float:
    """What match_order minimizes, written out window by window: every window of ``period`` steps ending
    inside the phase's first block, the stream (the steps before, then the classes in ``order``) against
    the build's same steps, largest |Δ tokens| over sources ÷ the build window's tokens."""
    period, n_src = classes.shape
    pad = period - len(before)
    stream = np.concatenate([np.zeros((pad, n_src)), before, classes[order]])
    built = np.concatenate([np.zeros((pad, n_src)), before_build, build])
    worst = 0.0
    for j in range(1, period + 1):
        s, b = stream[j : j + period].sum(axis=0), built[j : j + period].sum(axis=0)
        tokens = b.sum() if len(before) else build.sum()
        worst = max(worst, float(np.abs(s - b).max() / max(tokens, 1.0)))
    return worst


def problem(seed: int, period: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Classes of one main source each (as cost classes are: books in the heaviest, short documents in the
    lightest), the build's steps on their mean; before: another phase's classes in a random order."""
    rng = np.random.default_rng(seed)

    def phase() -> tuple[np.ndarray, np.ndarray]:
        classes = np.eye(3)[rng.integers(0, 3, period)] * 40 + rng.integers(0, 8, (period, 3))
        return classes, np.tile(classes.mean(axis=0), (period, 1))

    classes, build = phase()
    other, other_build = phase()
    return classes, build, other[rng.permutation(period)][:k], other_build[:k]


@settings(max_examples=40)
@given(st.integers(1, 9), st.integers(0, 8), st.integers(0, 9), st.integers(0, 2**31 - 1))
def test_an_order_is_a_permutation_with_the_tail_classes_first(period: int, r: int, k: int, seed: int) -> None:
    r %= period
    out = match_order(*problem(seed, period, min(k, period)), r=r)
    assert sorted(out.tolist()) == list(range(period))
    assert sorted(out[:r].tolist()) == tail_classes(period, r).tolist()
    assert template_order(period, r, out).tolist() == out.tolist()  # the template keeps it as it is


@pytest.mark.parametrize(("period", "r", "k"), [(4, 0, 4), (5, 2, 5), (6, 0, 3), (6, 3, 0), (7, 1, 7)])
@pytest.mark.parametrize("seed", range(4))
def test_the_order_is_the_best_of_all_orders(period: int, r: int, k: int, seed: int) -> None:
    classes, build, before, before_build = problem(seed, period, k)
    tail = set(tail_classes(period, r).tolist())
    allowed = [p for p in itertools.permutations(range(period)) if set(p[:r]) == tail]
    best = min(boundary_error(list(p), classes, build, before, before_build) for p in allowed)
    got = match_order(classes, build, before, before_build, r)
    assert boundary_error(got.tolist(), classes, build, before, before_build) == pytest.approx(best, abs=1e-12)
    heaviest = template_order(period, r).tolist()  # what the layout was before: often far worse
    assert best <= boundary_error(heaviest, classes, build, before, before_build)


def test_beyond_the_exact_size_each_position_is_chosen_greedily(monkeypatch: pytest.MonkeyPatch) -> None:
    classes, build, before, before_build = problem(3, 8, 8)
    exact = match_order(classes, build, before, before_build, 3)
    monkeypatch.setattr(order_module, "EXACT", 4)
    greedy = match_order(classes, build, before, before_build, 3)
    assert sorted(greedy.tolist()) == list(range(8)) and set(greedy[:3].tolist()) == set(tail_classes(8, 3).tolist())
    assert boundary_error(exact.tolist(), classes, build, before, before_build) <= boundary_error(
        greedy.tolist(), classes, build, before, before_build
    )


@pytest.mark.parametrize(("steps", "tail"), [(10, 0), (20, 0), (23, 3), (20, 4)])
def test_first_block_and_a_custom_order_lay_out_each_class_once_per_block(steps: int, tail: int) -> None:
    period, size = 10, 4
    rng = np.random.default_rng(steps + tail)
    costs = rng.pareto(1.0, steps * size) + 1.0
    src = rng.integers(0, 9, (steps * size, 3)).astype(float)
    classes = first_block(costs, src, steps, period, tail)
    r = steps % period or tail % period
    custom = np.roll(np.arange(period), 3)
    order = template_order(period, r, custom)  # tail classes moved to the front, the rest as given
    new = regroup_window(costs, src, steps, period=period, tail=tail, order=custom)
    comp = np.zeros((steps, 3))
    np.add.at(comp, new, src)
    # the first block holds class order[p] at position p: first_block's rows, in that order
    assert np.allclose(comp[:period], classes[order])
    top = np.array([costs[new == s].max() for s in range(steps)])
    heaviest = regroup_window(costs, src, steps, period=period, tail=tail)
    top_before = np.array([costs[heaviest == s].max() for s in range(steps)])
    position = np.argsort(template_order(period, r))
    for p in range(steps):  # step p holds the class the heaviest-first layout had at its position
        block, pos = divmod(p, period)
        assert top[p] == top_before[block * period + position[order[pos]]]
