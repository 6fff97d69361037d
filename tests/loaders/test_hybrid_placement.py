"""loaders/hybrid_placement.py: a hybrid deal under way, on numpy. LPT keeps Graham's bound (no rank above
the mean plus the longest document) and never overfills a micro-batch; a split document goes to an aligned
block, the least busy of those with room unless a new micro-batch on the least busy one costs less;
``state`` / ``restore`` and ``open_micro_batches`` keep the state whole; ``place`` places every document,
splitting (where asked) only the longest whole ones; the
refinement never makes the busiest rank busier; the result's rank times are the documents' times summed
afresh, relabelled. (The kernels' engine: test_hybrid_kernels.py.)"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.cost import FLEXSP_7B, CostModel
from loaders.hybrid_placement import EXACT, REFINE_ROUNDS, SWAP_CANDIDATES, TAIL_SHARE, Placement

COSTS = [CostModel(1.0, 512.0), FLEXSP_7B, CostModel(1.0, 0.0, comm_bytes=1.0)]


def placement(seed: int, n: int, split: bool, width: int = 1) -> Placement:
    """A fresh numpy placement of ``n`` random documents (longer than a rank's capacity where ``split``)."""
    rng = np.random.default_rng(seed)
    ranks = int(rng.choice([1, 2, 3, 4, 8, 12, 16]))
    cap = int(rng.choice([100, 1000]))
    top = 1 << (ranks.bit_length() - 1)
    lens = rng.integers(1, cap * (top if split else 1) + 1, n).astype(np.int64)
    degree = 1 << np.ceil(np.log2(-(-lens // cap))).astype(np.int64)
    cost = COSTS[int(rng.integers(len(COSTS)))]
    time = np.asarray(cost.time(lens, degree, 8), dtype=np.float64).reshape(-1)
    return Placement(lens, degree, time, ranks, cap, 8, cost, width, None)


def longest_first(p: Placement, docs: np.ndarray) -> np.ndarray:
    return docs[np.argsort(-p.time[docs], kind="stable")]


@settings(max_examples=80)
@given(st.integers(0, 2**32 - 1), st.integers(1, 200))
def test_lpt_keeps_grahams_bound_and_every_micro_batch_within_its_room(seed: int, n: int) -> None:
    p = placement(seed, n, split=False)
    docs = longest_first(p, np.arange(n))
    p.lpt(docs)
    assert (p.first >= 0).all() and (p.mb >= 0).all() and (p.mb < p.micro_batches).all()
    assert (p.room >= 0).all()
    held = np.zeros_like(p.room)
    np.add.at(held, (p.first, p.mb), p.share)
    assert (held + p.room == p.cap).all()  # room is what the documents leave, micro-batch by micro-batch
    np.testing.assert_allclose(p.load, np.bincount(p.first, weights=p.time, minlength=p.ranks), rtol=1e-12)
    if p.per_mb == 0:  # a micro-batch costs nothing: each document on the least-loaded rank, room opened if need be
        assert p.load.max() <= p.time.sum() / p.ranks + p.time.max() * (1 + 1e-9)


@settings(max_examples=80)
@given(st.integers(0, 2**32 - 1), st.integers(1, 60), st.integers(1, 3))
def test_a_block_goes_to_the_least_busy_aligned_block_with_room(seed: int, n: int, width: int) -> None:
    p = placement(seed, n, split=True, width=width)
    for j in longest_first(p, np.arange(n)).tolist():
        d = int(p.degree[j])
        busiest = p.load[: p.ranks // d * d].reshape(-1, d).max(axis=1)
        fits = (p.room[: p.ranks // d * d].reshape(-1, d, p.micro_batches).min(axis=1) >= p.share[j]).any(axis=1)
        width_before = p.micro_batches
        assert p.place_block(j)
        b = int(p.first[j]) // d
        assert p.first[j] % d == 0 and p.first[j] + d <= p.ranks and (p.room >= 0).all()
        if p.micro_batches == width_before:  # no new micro-batch: a block with room, the least busy of them
            assert fits[b] and busiest[b] == busiest[fits].min() and busiest[b] - busiest.min() <= p.per_mb
        else:  # a new one, on the least busy block: none had room, or only blocks busier by a micro-batch's cost
            assert not fits.any() or busiest[fits].min() - busiest.min() > p.per_mb
            assert busiest[b] == busiest.min() and p.mb[j] == width_before


def test_state_restore_and_new_micro_batches_keep_the_state_whole() -> None:
    p = placement(1, 50, split=False, width=2)
    p.lpt(longest_first(p, np.arange(25)))
    saved, width, load = p.state(), p.micro_batches, p.load.copy()
    first = p.open_micro_batches(3)
    assert first == width and p.micro_batches == width + 3 and (p.room[:, width:] == p.cap).all()
    p.lpt(longest_first(p, np.arange(25, 50)))
    p.restore(saved)
    assert p.micro_batches == width and (p.first[25:] == -1).all() and (p.first[:25] >= 0).all()
    assert np.array_equal(p.load, load)


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.sampled_from([10, 300, 1200]), st.booleans())
def test_place_places_everything_and_refine_never_makes_the_busiest_busier(seed: int, n: int, split: bool) -> None:
    p = placement(seed, n, split=split).place()
    assert (p.first >= 0).all() and (p.first % p.degree == 0).all() and (p.room >= 0).all()
    before = p.makespan()
    p.refine()
    assert p.makespan() <= before * (1 + 1e-12) and (p.room >= 0).all()
    relabel = seed % (p.ranks & -p.ranks)
    degree, first, mb, times, width = p.result(relabel)
    assert width == p.micro_batches and (first % degree == 0).all() and np.array_equal(mb, p.mb)
    # rank times are the documents' times on each rank of their blocks, relabelled by XOR
    expected = np.zeros(p.ranks)
    for j in range(n):
        expected[p.first[j] : p.first[j] + degree[j]] += p.time[j]
    np.testing.assert_allclose(times[np.arange(p.ranks) ^ relabel], expected + width * p.per_mb, rtol=1e-9)


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.sampled_from([10, 300]), st.booleans())
def test_place_splits_only_the_longest_whole_documents_and_only_where_asked(seed: int, n: int, split: bool) -> None:
    p = placement(seed, n, split=split)
    whole = longest_first(p, np.flatnonzero(p.degree == 1))
    p.place()
    assert (p.first >= 0).all() and (p.room >= 0).all()
    # the whole documents split before the fill: the first ``unfit`` of them, longest first, every one of them
    assert 0 <= p.unfit <= len(whole) and (p.degree[whole[: p.unfit]] > 1).all()
    assert (p.degree[whole[p.unfit :]] == 1).all()
    q = placement(seed, n, split=split).place(split_unfit=False)
    assert q.unfit == 0 and (q.degree[whole] == 1).all()


def test_the_constants_are_sane() -> None:
    assert EXACT >= 1 and TAIL_SHARE > 1 and REFINE_ROUNDS >= 1 and SWAP_CANDIDATES >= 2
