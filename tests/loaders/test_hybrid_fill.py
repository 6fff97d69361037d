"""loaders/hybrid_fill.py: the hybrid deal's water-fill, on numpy. Classes split the times at powers of
CLASS_RATIO below the longest; the water level fills the shortfalls with the total; runs are laid next fit,
within each micro-batch's room, in order; and a water-fill places every document, within capacity, with no
rank above the level of the whole fill plus the longest document (a micro-batch costing nothing).
(The kernels' engine: test_hybrid_kernels.py.)"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.cost import CostModel
from loaders.hybrid_fill import CLASS_RATIO, CLASSES, _runs, _water_level, classes_of, water_fill
from loaders.hybrid_placement import Placement


def placement(seed: int, n: int, ranks: int, width: int) -> Placement:
    """A numpy placement of ``n`` long-tailed whole documents, random loads already on the ranks."""
    rng = np.random.default_rng(seed)
    cap = 4096
    lens = np.minimum((rng.pareto(1.1, n) * 60 + 1).astype(np.int64), cap)
    cost = CostModel(1.0, 512.0)
    degree = np.ones(n, np.int64)
    time = np.asarray(cost.time(lens, degree, 8), dtype=np.float64).reshape(-1)
    p = Placement(lens, degree, time, ranks, cap, 8, cost, width, None)
    p.load = rng.random(ranks) * time.max() * 4
    return p


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(1e-6, 1e12), min_size=1, max_size=300))
def test_classes_split_the_times_at_powers_of_the_class_ratio(times: list[float]) -> None:
    t = np.sort(np.array(times))[::-1]
    starts = classes_of(t)
    assert len(starts) == CLASSES - 1 and (np.diff(starts) >= 0).all()
    for c, part in enumerate(np.split(t, starts)):
        ratio = t[0] / part
        assert (ratio >= CLASS_RATIO**c * (1 - 1e-9)).all()
        if c < CLASSES - 1:
            assert (ratio < CLASS_RATIO ** (c + 1) * (1 + 1e-9)).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(0, 1e12), min_size=1, max_size=70), st.floats(0, 1e13))
def test_the_water_level_fills_the_shortfalls_with_the_total(loads: list[float], total: float) -> None:
    load = np.array(loads)
    level = _water_level(load, total)
    assert level >= load.min()
    assert np.isclose(np.maximum(level - load, 0).sum(), total, rtol=1e-9, atol=1e-3)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 400), st.sampled_from([1, 3, 8, 64]), st.integers(1, 3))
def test_runs_are_laid_next_fit_in_order_within_each_micro_batch(seed: int, n: int, ranks: int, width: int) -> None:
    p = placement(seed, n, ranks, width)
    rng = np.random.default_rng(seed)
    p.room = rng.integers(0, p.cap + 1, (ranks, width))
    room = p.room.copy()
    rank = np.sort(rng.integers(0, ranks, n))
    left = _runs(p, np.arange(n), rank)
    placed = np.setdiff1d(np.arange(n), left)
    assert (p.first[placed] == rank[placed]).all() and (p.first[left] == -1).all()
    held = np.zeros_like(room)
    np.add.at(held, (p.first[placed], p.mb[placed]), p.share[placed])
    assert (held + p.room == room).all() and (p.room >= 0).all()
    for r in range(ranks):  # a run's documents keep their order through the micro-batches
        mine = placed[p.first[placed] == r]
        assert (np.diff(p.mb[mine]) >= 0).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([300, 3000]), st.sampled_from([2, 12, 64]), st.integers(1, 3))
def test_a_water_fill_places_everything_within_capacity_and_near_the_level(
    seed: int, n: int, ranks: int, width: int
) -> None:
    p = placement(seed, n, ranks, width)
    docs = np.argsort(-p.time, kind="stable")
    start = p.load.copy()
    level = _water_level(start, float(p.time.sum()))
    water_fill(p, docs)
    assert (p.first >= 0).all() and (p.mb >= 0).all() and (p.room >= 0).all()
    held = np.zeros_like(p.room)
    np.add.at(held, (p.first, p.mb), p.share)
    assert (held + p.room == p.cap).all()
    np.testing.assert_allclose(p.load, start + np.bincount(p.first, weights=p.time, minlength=ranks), rtol=1e-9)
    assert p.load.max() <= max(level, start.max()) + p.time.max() * (1 + 1e-9)
