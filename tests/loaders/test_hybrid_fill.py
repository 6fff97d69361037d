"""loaders/hybrid_fill.py: the hybrid deal's water-fill, on numpy. Classes split the times at powers of
CLASS_RATIO below the longest; the water level fills the shortfalls with the total; runs are laid next fit,
within each micro-batch's room, in order; and a water-fill places every document, within capacity, with no
rank above the level of the whole fill plus the longest document (a micro-batch costing nothing). Where a
micro-batch costs, the merge deals a step one long document bounds in the micro-batches its tokens need plus one
(the water-fill alone: twice as many), never slower than without it, and every engine alike.
(The kernels' engine: test_hybrid_kernels.py.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.cost import CostModel
from loaders import hybrid_placement
from loaders.hybrid import HybridWorld, deal
from loaders.hybrid_fill import CLASS_RATIO, CLASSES, _runs, _water_level, classes_of, water_fill
from loaders.hybrid_placement import Placement
from tests.loaders.test_hybrid import ENGINES, check, dealt_alike, pareto, random_case

# H200's fitted constants (benchmarks/hybrid.py --cost ...): a micro-batch costs some 0.6 % of a 131072-token step
H200 = CostModel(
    1.0, 6502.6, per_document=88624.0, per_micro_batch=1.70589e7, unit_seconds=8.65678e-11, comm_bytes=32768.0
)


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


@settings(max_examples=100)
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


@settings(max_examples=100)
@given(st.lists(st.floats(0, 1e12), min_size=1, max_size=70), st.floats(0, 1e13))
def test_the_water_level_fills_the_shortfalls_with_the_total(loads: list[float], total: float) -> None:
    load = np.array(loads)
    level = _water_level(load, total)
    assert level >= load.min()
    assert np.isclose(np.maximum(level - load, 0).sum(), total, rtol=1e-9, atol=1e-3)


@settings(max_examples=60)
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


@settings(max_examples=40)
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


def test_a_step_one_long_document_bounds_is_merged_into_the_micro_batches_its_tokens_need_plus_one() -> None:
    """Four documents of 131072 tokens on blocks of 8 ranks bound the step; the water-fill piles the short
    documents' tokens on the ranks the blocks leave light, in micro-batches the others do not need (6 of them
    before the merge); merged, 3 (the tokens need 2, at 99.99 % full no packing has them), and the busiest rank
    holds no more than one long document's time."""
    short = pareto(np.random.default_rng(0), 3800, 64, 16384, 1.2)
    lens = np.concatenate([np.full(4, 131072), [109785, 98771, 29672, 19085, 18680, 17745, 17620], short])
    world = HybridWorld(8, 8, 16384)
    longest = float(np.asarray(H200.time(np.array([131072]), np.array([8]), 8)).reshape(-1)[0])
    ref = deal(lens, world, H200, seed=3, engine="numpy")
    check(lens, world, H200, ref)
    assert ref.micro_batches <= 3
    assert ref.rank_time.max() <= (longest + 3 * H200.per_micro_batch) * (1 + 1e-12)
    for engine in ENGINES[1:]:
        d = deal(lens, world, H200, seed=3, engine=engine)
        assert all(np.array_equal(getattr(d, a), getattr(ref, a)) for a in ("degree", "first_rank", "micro_batch"))


@settings(max_examples=30)
@given(st.integers(0, 2**32 - 1), st.booleans(), st.sampled_from([1e-3, 1e-2, 0.1]))
def test_merging_micro_batches_is_never_slower_and_every_engine_merges_alike(
    seed: int, tight: bool, share: float
) -> None:
    lengths, world, cost, _ = random_case(seed, tight)
    mean = float(np.asarray(cost.time(lengths, np.ones_like(lengths), world.gpus_per_node)).sum()) / world.size
    cost = dataclasses.replace(cost, per_micro_batch=mean * share)  # a micro-batch: this share of a rank's time
    ref = dealt_alike(lengths, world, cost, seed)
    with pytest.MonkeyPatch.context() as m:  # the same deal, but for the merge
        m.setattr(hybrid_placement, "merge", lambda p: None)
        unmerged = deal(lengths, world, cost, seed=seed, engine="numpy")
    assert ref.rank_time.max() <= unmerged.rank_time.max() * (1 + 1e-9)
