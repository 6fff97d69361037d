"""loaders/hybrid.py: the hybrid data-parallel deal. Every document is placed exactly once, whole or on an aligned
power-of-two block big enough for its tokens; no rank's micro-batch holds more than its capacity; the reported rank
times are the cost model's; the deal is a function of its arguments; long documents are split and short ones are
not, unless no rank could take one below the mean; split documents that would stack on a block go half as far
instead; no micro-batch is empty on every rank; a small step whose documents all fit one rank is dealt no worse than
LPT of whole documents; and every engine (numpy, the kernels interpreted, compiled where numba is installed) deals
the pinned inputs as the reference deal did, and random steps alike. (Timing is a script's business, not a test's:
``benchmarks/hybrid_plan.py``.)"""

from __future__ import annotations

import hashlib
import heapq
import importlib.util

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.cost import FLEXSP_7B, CostModel
from loaders.hybrid import Deal, HybridWorld, deal

HAS_NUMBA = importlib.util.find_spec("numba") is not None
ENGINES = ["numpy", "interpreted", *(["compiled"] if HAS_NUMBA else [])]
COSTS = [
    CostModel(),
    CostModel(1.0, 8192.0),
    FLEXSP_7B,
    CostModel(1.0, 64.0, per_document=100.0, group_latency=1e-4, comm_bytes=2048.0),
    CostModel(1e-3, 1.0, comm_bytes=0.0),
    CostModel(0.0, 0.0),  # every document free: still placed, once
]


def check(lengths: np.ndarray, world: HybridWorld, cost: CostModel, d: Deal) -> None:
    """Every property a deal promises, recomputed from its arrays."""
    n, ranks = len(lengths), world.size
    for name in ("degree", "first_rank", "micro_batch"):
        arr = getattr(d, name)
        assert arr.dtype == np.int64 and arr.shape == (n,), name
    assert d.rank_time.dtype == np.float64 and d.rank_time.shape == (ranks,)
    deg, first, mb = d.degree, d.first_rank, d.micro_batch
    assert ((deg & (deg - 1)) == 0).all() and (deg >= 1).all()  # powers of two
    least = -(-lengths // world.capacity)
    assert (deg >= least).all() and (deg <= ranks).all()
    assert (first % deg == 0).all() and (first >= 0).all() and (first + deg <= ranks).all()  # aligned, inside
    assert (mb >= 0).all() and (mb < max(d.micro_batches, 1)).all()
    assert n == 0 or np.unique(mb).tolist() == list(range(d.micro_batches)), "a micro-batch empty on every rank"
    tokens = np.zeros((ranks, max(d.micro_batches, 1)))
    expected = np.full(ranks, d.micro_batches * cost.per_micro_batch)
    per_rank = np.asarray(cost.time(lengths, deg, world.gpus_per_node), dtype=np.float64).reshape(-1)
    for j in range(n):
        tokens[first[j] : first[j] + deg[j], mb[j]] += lengths[j] / deg[j]
        expected[first[j] : first[j] + deg[j]] += per_rank[j]
    assert (tokens <= world.capacity * (1 + 1e-12)).all()  # a block's document is l/d on each of its ranks
    assert np.isclose(tokens.sum(), lengths.sum())  # tokens conserved
    np.testing.assert_allclose(d.rank_time, expected, rtol=1e-9, atol=1e-6)
    # each document exactly once: on each rank of its block, in its micro-batch, nowhere else
    seen = np.zeros(n, np.int64)
    for rank in range(ranks):
        parts = d.rank_documents(rank)
        assert len(parts) == d.micro_batches
        for m, docs in enumerate(parts):
            assert docs.dtype == np.int64 and (mb[docs] == m).all()
            assert ((first[docs] <= rank) & (rank < first[docs] + deg[docs])).all()
            # one total order (degree descending, then index): a block's ranks meet its documents alike
            keys = list(zip((-deg[docs]).tolist(), docs.tolist(), strict=True))
            assert keys == sorted(keys)
            seen[docs] += 1
    assert (seen == deg).all()


@st.composite
def steps(draw: st.DrawFn) -> tuple[np.ndarray, HybridWorld, CostModel, int]:
    dp = draw(st.integers(1, 6))
    cp = draw(st.sampled_from([1, 2, 3, 4, 8]))
    world = HybridWorld(dp, cp, draw(st.sampled_from([8, 100, 1024])), draw(st.sampled_from([1, 2, 4, 8])))
    top = 1 << (world.size.bit_length() - 1)
    longest = draw(st.sampled_from([world.capacity, world.capacity * top]))
    lengths = np.array(draw(st.lists(st.integers(1, longest), max_size=40)), dtype=np.int64)
    return lengths, world, draw(st.sampled_from(COSTS)), draw(st.integers(0, 2**40))


@settings(max_examples=120)
@given(steps())
def test_a_deal_places_each_document_once_within_capacity_on_aligned_blocks(
    case: tuple[np.ndarray, HybridWorld, CostModel, int],
) -> None:
    lengths, world, cost, seed = case
    d = deal(lengths, world, cost, seed=seed)
    check(lengths, world, cost, d)
    again = deal(lengths.copy(), world, cost, seed=seed)  # deterministic: the same arrays, bit for bit
    for name in ("degree", "first_rank", "micro_batch", "rank_time"):
        assert np.array_equal(getattr(d, name), getattr(again, name)), name
    assert again.micro_batches == d.micro_batches


def test_the_seed_relabels_ranks_without_changing_the_deals_quality() -> None:
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(1, 2000, 300), [20_000, 9_000]])
    world = HybridWorld(dp=4, cp=4, capacity=4096)
    deals = [deal(lengths, world, CostModel(1.0, 512.0), seed=s) for s in range(6)]
    for d in deals:
        check(lengths, world, CostModel(1.0, 512.0), d)
    assert len({tuple(d.first_rank.tolist()) for d in deals}) > 1  # other ranks carry the blocks
    assert len({round(float(d.rank_time.max()), 3) for d in deals}) == 1
    assert all(np.array_equal(np.sort(d.rank_time), np.sort(deals[0].rank_time)) for d in deals)


def test_a_long_document_is_split_and_short_ones_stay_whole() -> None:
    world = HybridWorld(dp=4, cp=2, capacity=1000)
    lengths = np.array([3500] + [10, 20, 99, 100, 7, 1] * 40)
    d = deal(lengths, world, CostModel(1.0, 8192.0))
    check(lengths, world, CostModel(1.0, 8192.0), d)
    assert d.degree[0] >= 4 and (d.degree[1:] == 1).all()
    # few short documents could even out only split, which a fixed cost per split document forbids
    lengths = np.array([3500, 10, 20, 99, 100, 7, 1])
    latency = CostModel(1.0, 8192.0, group_latency=1e-2)
    d = deal(lengths, world, latency)
    check(lengths, world, latency, d)
    assert d.degree[0] >= 4 and (d.degree[1:] == 1).all()
    # a document that fits but whose attention alone outweighs the rest is split for its cost
    lengths = np.array([900] + [10] * 50)
    cheap_comm = CostModel(1.0, 0.0, comm_bytes=1.0)
    d = deal(lengths, world, cheap_comm)
    check(lengths, world, cheap_comm, d)
    assert d.degree[0] > 1 and (d.degree[1:] == 1).all()
    assert d.compute_imbalance < 1.5


def test_comm_keeps_a_document_whole_when_splitting_costs_more_than_it_saves() -> None:
    world = HybridWorld(dp=2, cp=1, capacity=1000)
    lengths = np.array([900, 10])
    dear = CostModel(1.0, 0.0, comm_bytes=1e9, unit_seconds=1e-9)  # seconds of transfer per token
    assert dear.time(900, 2, 8) > dear.time(900, 1, 8)
    d = deal(lengths, world, dear)
    check(lengths, world, dear, d)
    assert (d.degree == 1).all()


def blocks_over_every_rank(extra: list[int]) -> tuple[np.ndarray, HybridWorld, CostModel]:
    """Eight documents of 32768 tokens, each split over 8 of 64 ranks of 8192 tokens (the whole world
    covered), ``extra``, and short documents that fill the step to about one micro-batch of every rank."""
    short = np.random.default_rng(0).integers(64, 2048, 230)
    lengths = np.concatenate([[32768] * 8, extra, short]).astype(np.int64)
    return lengths, HybridWorld(16, 4, 8192), CostModel(1.0, 49152.0)


def test_a_whole_document_no_rank_can_take_below_the_mean_is_split() -> None:
    # every rank carries a block: the 7252-token document whole would lift any rank a third above the mean
    lengths, world, cost = blocks_over_every_rank([7252])
    d = deal(lengths, world, cost)
    check(lengths, world, cost, d)
    assert d.degree[8] > 1 and d.compute_imbalance <= 1.05


def test_documents_that_would_stack_on_a_block_go_half_as_far_instead() -> None:
    # a ninth document of 32768 tokens at degree 8 stacks two on one block of 8; two at degree 4 do not
    lengths, world, cost = blocks_over_every_rank([32768])
    d = deal(lengths, world, cost)
    check(lengths, world, cost, d)
    stacked = 2 * float(np.asarray(cost.time(32768, 8, world.gpus_per_node)))
    half = float(np.asarray(cost.time(32768, 4, world.gpus_per_node)))
    assert half < stacked and d.rank_time.max() <= half * (1 + 1e-9)
    assert (d.degree[:9] == 4).sum() >= 2


def lpt_makespan(times: np.ndarray, ranks: int) -> float:
    """Every document whole on the least-loaded rank, longest first."""
    heap = [(0.0, r) for r in range(ranks)]
    for t in sorted(times.tolist(), reverse=True):
        load, r = heap[0]
        heapq.heapreplace(heap, (load + t, r))
    return max(load for load, _ in heap)


@settings(max_examples=80)
@given(
    st.lists(st.integers(1, 4096), min_size=1, max_size=60),
    st.integers(1, 4),
    st.sampled_from([1, 2, 4]),
    st.sampled_from(COSTS[:5]),
)
def test_a_deal_of_documents_that_all_fit_is_never_worse_than_lpt_of_whole_ones(
    lens: list[int], dp: int, cp: int, cost: CostModel
) -> None:
    lengths = np.array(lens, dtype=np.int64)
    world = HybridWorld(dp, cp, capacity=int(lengths.sum()))  # everything fits one micro-batch of one rank
    d = deal(lengths, world, cost)
    check(lengths, world, cost, d)
    baseline = lpt_makespan(np.asarray(cost.time(lengths, 1), dtype=np.float64).reshape(-1), world.size)
    assert d.rank_time.max() <= (baseline + d.micro_batches * cost.per_micro_batch) * (1 + 1e-12)


def test_a_large_step_is_balanced_and_respects_capacity() -> None:
    """1 M tokens of a long-tailed mix over 64 ranks (the water-filled path): near-even ranks."""
    rng = np.random.default_rng(7)
    lengths = np.minimum((rng.pareto(1.1, 6000) * 150 + 1).astype(np.int64), 8192)
    world = HybridWorld(dp=8, cp=8, capacity=8192)
    cost = CostModel(1.0, 8192.0)
    d = deal(lengths, world, cost)
    check(lengths, world, cost, d)
    t = np.asarray(cost.time(lengths, d.degree), dtype=np.float64)
    bound = max(float((d.degree * t).sum()) / world.size, float(t.max()))  # no deal of these degrees is faster
    assert d.rank_time.max() <= bound * 1.01
    assert d.micro_batches <= -(-int(lengths.sum()) // (world.size * world.capacity)) + 2


def test_an_empty_step_and_refusals() -> None:
    world = HybridWorld(dp=2, cp=2, capacity=100)
    d = deal(np.zeros(0, np.int64), world, CostModel())
    assert d.micro_batches == 0 and d.rank_time.tolist() == [0.0] * 4 and d.compute_imbalance == 1.0
    assert d.rank_documents(3) == []
    with pytest.raises(ValueError, match="needs 8 ranks"):
        deal(np.array([50, 701]), world, CostModel())  # 4 ranks of 100 tokens hold 400
    with pytest.raises(ValueError, match="at least 1"):
        deal(np.array([5, 0]), world, CostModel())
    with pytest.raises(ValueError, match="1-D array of ints"):
        deal(np.array([1.5]), world, CostModel())
    with pytest.raises(ValueError, match="outside the world"):
        deal(np.array([5]), world, CostModel()).rank_documents(4)
    for bad in ({"dp": 0}, {"capacity": -1}, {"cp": 1.5}, {"gpus_per_node": True}):
        with pytest.raises(ValueError, match="expected an int"):
            HybridWorld(**{"dp": 1, "cp": 1, "capacity": 8, **bad})  # type: ignore[arg-type]


# -- the deal pinned: the same assignment, bit for bit, for fixed inputs ------------------------------------


def pareto(rng: np.random.Generator, n: int, lo: int, hi: int, alpha: float) -> np.ndarray:
    """int64 [n]: truncated-Pareto lengths in ``[lo, hi]``."""
    u = rng.random(n)
    return np.minimum(hi, lo / (1 - u * (1 - (lo / hi) ** alpha)) ** (1 / alpha)).astype(np.int64)


Case = tuple[np.ndarray, HybridWorld, CostModel, int]
CHEAP_COMM = CostModel(1.0, 0.0, comm_bytes=1.0)


def named_cases() -> dict[str, Case]:
    """Steps that take the deal's paths: water-filling at 64 ranks, blocks of every degree, a cost per
    micro-batch, a small step split for cost, latency, crowded capacity."""
    r = np.random.default_rng
    split = np.concatenate([pareto(r(2), 2500, 64, 65536, 1.2), [65536, 32768]])
    mb_cost = CostModel(1.0, 512.0, per_micro_batch=5e6)
    return {
        "longtail 64": (pareto(r(1), 6000, 16, 8192, 1.1), HybridWorld(8, 8, 8192), COSTS[1], 3),
        "split 64": (split, HybridWorld(16, 4, 8192), CostModel(1.0, 49152.0), 5),
        "flexsp": (pareto(r(3), 3000, 128, 131072, 1.1), HybridWorld(8, 8, 16384), FLEXSP_7B, 7),
        "small fits": (pareto(r(4), 40, 1, 4000, 1.0), HybridWorld(4, 2, 100000), CHEAP_COMM, 0),
        "latency 12": (pareto(r(5), 600, 8, 20000, 1.3), HybridWorld(6, 2, 4096), COSTS[3], 11),
        "crowded": (pareto(r(6), 4000, 32, 4096, 0.9), HybridWorld(4, 4, 2048), CostModel(1.0, 512.0), 13),
        "crowded mb": (pareto(r(7), 2000, 32, 8192, 0.9), HybridWorld(4, 4, 2048), mb_cost, 17),
    }


def random_case(seed: int, tight: bool) -> Case:
    """A random world, cost and step: long-tailed lengths (``tight``: uniform up to the largest block, on
    ranks of 100 tokens, where blocks run out of room and open micro-batches)."""
    rng = np.random.default_rng(seed)
    costs = [*COSTS[:5], CHEAP_COMM]
    if tight:
        dp, cp, cap = int(rng.integers(1, 5)), int(rng.choice([1, 2, 4])), 100
        top = 1 << ((dp * cp).bit_length() - 1)
        lengths = rng.integers(1, cap * top + 1, int(rng.choice([10, 30, 100])))
    else:
        dp, cp, cap = int(rng.integers(1, 7)), int(rng.choice([1, 2, 4, 8])), int(rng.choice([100, 1000, 4096]))
        top = 1 << ((dp * cp).bit_length() - 1)
        lengths = np.maximum(
            pareto(rng, int(rng.choice([10, 60, 300, 1500])), 1, cap * int(rng.choice([1, top])), 1.0), 1
        )
    return lengths.astype(np.int64), HybridWorld(dp, cp, cap), costs[int(rng.integers(len(costs)))], seed


def digest(deals: list[Deal]) -> str:
    """The first 16 hex digits of a sha256 over the assignment of ``deals`` (degrees, blocks, micro-batches;
    not the rank times, whose float sums may differ in the last bit between CPU instruction sets)."""
    h = hashlib.sha256()
    for d in deals:
        for a in (d.degree, d.first_rank, d.micro_batch):
            h.update(np.ascontiguousarray(a).tobytes())
        h.update(str(d.micro_batches).encode())
    return h.hexdigest()[:16]


PINNED = {
    "longtail 64": "c8e89a53059f434f",
    "split 64": "096dd082c865dced",
    "flexsp": "969b3255f8aa4001",
    "small fits": "6c4547b9c67166df",
    "latency 12": "da0be3bfaa2468dc",
    "crowded": "32669556e4b202af",  # 8125a9cda182d2c5 until its 32nd micro-batch, empty on every rank, was dropped
    "crowded mb": "8f14e2619456d3dc",
    "random": "e3c1bb990316a6c8",
    "random tight": "8ed0af6e265a6ef8",
}


def pinned_deals(engine: str) -> dict[str, list[Deal]]:
    def one(case: Case) -> Deal:
        lengths, world, cost, seed = case
        return deal(lengths, world, cost, seed=seed, engine=engine)

    out = {name: [one(case)] for name, case in named_cases().items()}
    out["random"] = [one(random_case(s, False)) for s in range(60)]
    out["random tight"] = [one(random_case(s, True)) for s in range(30)]
    return out


def test_no_micro_batch_is_left_empty_on_every_rank() -> None:
    """The water-fill opens micro-batches ahead of need; one that no document ended up in (the crowded case
    had its 32nd so) is dropped, so no trainer runs a pass with nothing in it on every rank."""
    lengths, world, cost, seed = named_cases()["crowded"]
    d = deal(lengths, world, cost, seed=seed)
    check(lengths, world, cost, d)
    assert d.micro_batches == 31


@pytest.mark.parametrize("engine", ENGINES)
def test_the_deal_is_pinned_for_fixed_inputs(engine: str) -> None:
    """A faster deal must be the same deal: these digests are of the reference deal of each input."""
    got = {name: digest(deals) for name, deals in pinned_deals(engine).items()}
    assert got == PINNED


@settings(max_examples=40)
@given(st.integers(0, 2**32 - 1), st.booleans())
def test_every_engine_deals_a_random_step_as_numpy_does(seed: int, tight: bool) -> None:
    lengths, world, cost, _ = random_case(seed, tight)
    dealt_alike(lengths, world, cost, seed)


def dealt_alike(lengths: np.ndarray, world: HybridWorld, cost: CostModel, seed: int) -> Deal:
    """numpy's deal, checked (:func:`check`), after asserting every other engine deals it bit for bit."""
    ref = deal(lengths, world, cost, seed=seed, engine="numpy")
    check(lengths, world, cost, ref)
    for engine in ENGINES[1:]:
        d = deal(lengths, world, cost, seed=seed, engine=engine)
        for name in ("degree", "first_rank", "micro_batch", "rank_time"):
            assert np.array_equal(getattr(d, name), getattr(ref, name)), (engine, name)
        assert d.micro_batches == ref.micro_batches
    return ref
