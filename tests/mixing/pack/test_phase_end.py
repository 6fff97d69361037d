"""``mixing.pack.phase_end``: the drop priority is a fixed function of a unit's (source, doc_id, start, ord), blind to
its length and step; the targets share the excess among the sources in proportion to their surplus and sum to it;
``set_aside`` takes, per source, a prefix of the (latest step, priority) order that reaches the target, stops
before a unit that would pass it by more than ``overshoot``, and does not depend on the rows' order; ``take_drops``
takes exactly those units out of a pool."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.cost import CostModel
from mixing.pack.phase_end import drop_targets, priority, set_aside, take_drops
from mixing.pack.pool import make_pool


def _units(seed: int, n: int, n_src: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.stack(
        [
            rng.integers(1, 500, n),  # length
            rng.integers(0, n_src, n),  # source
            rng.integers(0, 10**6, n),  # doc_id
            rng.integers(0, 4, n) * 512,  # start
            rng.integers(0, 3, n),  # step
            rng.permutation(n),  # ord
        ],
        axis=1,
    ).astype(np.int64)


def test_priority_ignores_length_and_step_and_is_fixed() -> None:
    u = _units(0, 1000)
    p = priority(u)
    assert p.dtype == np.uint64 and len(np.unique(p)) == len(u)
    v = u.copy()
    v[:, 0] = 1 + (v[:, 0] * 7) % 499  # other lengths
    v[:, 4] += 5  # other steps
    assert np.array_equal(priority(v), p)
    assert np.array_equal(priority(u[::-1]), p[::-1])  # a unit's own, whatever the others
    w = u.copy()
    w[:, 5] += 1  # another place in the draw order: another priority
    assert (priority(w) != p).mean() > 0.99
    # not ordered by length: the rank correlation of priority and length is near zero
    rank = np.argsort(np.argsort(p))
    assert abs(np.corrcoef(rank, u[:, 0])[0, 1]) < 0.1


@given(
    held=st.lists(st.integers(0, 5000), min_size=1, max_size=5),
    split=st.lists(st.floats(0, 1), min_size=5, max_size=5),
    capacity=st.integers(0, 20000),
)
def test_drop_targets_share_the_excess_by_surplus(held: list[int], split: list[float], capacity: int) -> None:
    h = np.array(held, np.float64)
    w = np.array(split[: len(held)]) + 1e-9
    due = capacity * w / w.sum()  # Σ due = capacity, as the packer's dues
    t = drop_targets(h, due, capacity)
    excess = h.sum() - capacity
    assert (t >= 0).all()
    if excess <= 0:
        assert (t == 0).all()
        return
    assert t.sum() == pytest.approx(excess, rel=1e-9, abs=1e-6)
    over = np.maximum(h - due, 0)
    assert (t <= over + 1e-6).all()  # no source gives more than its surplus
    assert np.allclose(t * over.sum(), over * excess)  # in proportion to it


def _check_prefix(u: np.ndarray, targets: np.ndarray, overshoot: float, mask: np.ndarray) -> None:
    for s in range(len(targets)):
        mine = np.flatnonzero(u[:, 1] == s)
        order = mine[np.lexsort((priority(u[mine]), -u[mine, 4]))]
        taken = mask[order]
        k = int(taken.sum())
        assert taken[:k].all() and not taken[k:].any(), "not a prefix of the (latest step, priority) order"
        got = int(u[order[:k], 0].sum())
        if k < len(order):  # it stopped: the target reached, or the next unit would pass it by too much
            nxt = int(u[order[k], 0])
            assert got >= targets[s] or got + nxt > targets[s] + overshoot
        if k:  # it did not go on past the target
            assert got - int(u[order[k - 1], 0]) < targets[s]
            assert got <= targets[s] + overshoot


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 300),
    targets=st.lists(st.floats(0, 20000), min_size=3, max_size=3),
    overshoot=st.sampled_from([0.0, 50.0, 1e9]),
)
def test_set_aside_takes_a_length_blind_prefix_per_source(
    seed: int, n: int, targets: list[float], overshoot: float
) -> None:
    u = _units(seed, n)
    t = np.array(targets)
    mask = set_aside(u, t, overshoot)
    assert mask.dtype == np.bool_ and mask.shape == (n,)
    _check_prefix(u, t, overshoot, mask)
    perm = np.random.default_rng(seed).permutation(n)
    assert np.array_equal(set_aside(u[perm], t, overshoot), mask[perm])  # the rows' order does not matter


def test_set_aside_without_a_limit_reaches_every_target() -> None:
    u = _units(3, 2000)
    t = np.array([1000.0, 0.0, 30000.0])
    mask = set_aside(u, t)
    got = np.bincount(u[mask, 1], weights=u[mask, 0], minlength=3)
    assert got[0] >= 1000 and got[1] == 0 and got[2] >= 30000
    assert got[0] - 500 < 1000 and got[2] - 500 < 30000  # passed by less than one unit


def test_set_aside_prefers_the_latest_step() -> None:
    u = _units(4, 600)
    mask = set_aside(u, np.array([2000.0, 2000.0, 2000.0]))
    assert (u[mask, 4] == u[:, 4].max()).all()  # the last step's units suffice here: all drops come from it


@pytest.mark.parametrize("engine", ["python", "interpreted"])
def test_take_drops_takes_exactly_the_chosen_units_out_of_the_pool(engine: str) -> None:
    u = _units(5, 400)
    u = u[np.lexsort((u[:, 3], u[:, 2], u[:, 5], u[:, 1], u[:, 4]))]
    pool = make_pool(engine, 3, 512, CostModel())
    for step in range(3):
        pool.add(u[u[:, 4] == step])
    held = pool.held()
    tokens = np.bincount(held[:, 1], weights=held[:, 0], minlength=3)
    due = tokens * 0.9
    capacity = float(due.sum())
    out = take_drops(pool, due, capacity, 1e9)
    expect = set_aside(held, drop_targets(tokens, due, capacity))
    assert np.array_equal(out, held[expect])
    assert len(pool) == len(held) - len(out)
    assert np.array_equal(pool.held(), held[~expect])
    assert out[:, 0].sum() >= tokens.sum() - capacity
