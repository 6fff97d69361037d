"""loaders/hybrid_kernels.py: the hybrid deal's scalar kernels against the numpy placement they stand in for,
held on random placement states by every engine here (the kernels run by the interpreter, and compiled where
numba is installed): LPT, a block's placement, the water-fill's runs and passes leave the same loads, room,
blocks and micro-batches, bit for bit; the water level meets its definition; the engine's choice (numba or
not, the environment's override) and its refusals; and without numba the deal runs on numpy."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.cost import FLEXSP_7B, CostModel
from loaders import hybrid_fill
from loaders.hybrid import HybridWorld, deal
from loaders.hybrid_kernels import ENGINES, _water_level, default_engine, kernels
from loaders.hybrid_placement import Placement

HAS_NUMBA = importlib.util.find_spec("numba") is not None
KERNEL_ENGINES = ["interpreted", *(["compiled"] if HAS_NUMBA else [])]
COSTS = [CostModel(1.0, 512.0), FLEXSP_7B, CostModel(0.0, 0.0), CostModel(1.0, 0.0, comm_bytes=1.0)]
ROOT = Path(__file__).resolve().parents[2]


def placements(seed: int, engine: str) -> tuple[Placement, Placement, np.random.Generator]:
    """Two placements in one random state, one on numpy, one on ``engine``'s kernels: random loads (ties
    often: integers, or all zero), room (full, random, or nearly none) and documents (whole, some split)."""
    rng = np.random.default_rng(seed)
    ranks = int(rng.choice([1, 2, 3, 4, 6, 8, 16]))
    cap = int(rng.choice([64, 100, 1000]))
    top = 1 << (ranks.bit_length() - 1)
    n = int(rng.choice([1, 5, 40, 300]))
    lens = rng.integers(1, cap * int(rng.choice([1, top])) + 1, n).astype(np.int64)
    degree = 1 << np.ceil(np.log2(-(-lens // cap))).astype(np.int64)
    cost = COSTS[int(rng.integers(len(COSTS)))]
    time = np.asarray(cost.time(lens, degree, 8), dtype=np.float64).reshape(-1)
    width = int(rng.integers(1, 4))
    pair = []
    for kern in (None, kernels(engine)):
        p = Placement(lens, degree, time, ranks, cap, 8, cost, width, kern)
        pair.append(p)
    mode = seed % 3
    load = [np.zeros(ranks), rng.integers(0, 4, ranks).astype(np.float64) * time.max(), rng.random(ranks) * time.sum()]
    room = [
        np.full((ranks, width), pair[0].cap),
        rng.integers(0, pair[0].cap + 1, (ranks, width)),
        rng.integers(0, 3, (ranks, width)) * pair[0].cap // 2,
    ]
    for p in pair:
        p.load, p.room = load[mode].copy(), room[(seed // 3) % 3].astype(np.int64)
    return pair[0], pair[1], rng


def assert_same(a: Placement, b: Placement) -> None:
    for name in ("load", "room", "first", "mb"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("engine", KERNEL_ENGINES)
@settings(max_examples=60)
@given(seed=st.integers(0, 2**32 - 1))
def test_lpt_kernel_is_the_numpy_lpt(engine: str, seed: int) -> None:
    a, b, rng = placements(seed, engine)
    whole = np.flatnonzero(a.degree == 1)
    docs = whole[np.argsort(-a.time[whole], kind="stable")][: int(rng.integers(0, len(whole) + 1))]
    a.lpt(docs)
    b.lpt(docs)
    assert_same(a, b)
    assert (a.first[docs] >= 0).all() and (a.room >= 0).all()


@pytest.mark.parametrize("engine", KERNEL_ENGINES)
@settings(max_examples=60)
@given(seed=st.integers(0, 2**32 - 1), allow_open=st.booleans())
def test_block_kernel_is_the_numpy_block_placement(engine: str, seed: int, allow_open: bool) -> None:
    a, b, _ = placements(seed, engine)
    for j in np.argsort(-a.time, kind="stable").tolist():
        assert a.place_block(j, allow_open) == b.place_block(j, allow_open)
        assert_same(a, b)
        if a.first[j] >= 0:
            assert a.first[j] % a.degree[j] == 0 and (a.room >= 0).all()


@pytest.mark.parametrize("engine", KERNEL_ENGINES)
@settings(max_examples=60)
@given(seed=st.integers(0, 2**32 - 1))
def test_runs_kernel_is_the_numpy_runs(engine: str, seed: int) -> None:
    from loaders import hybrid_kernels

    a, b, rng = placements(seed, engine)
    docs = np.flatnonzero(a.degree == 1)
    rank = np.sort(rng.integers(0, a.ranks, len(docs)))
    left_a = hybrid_fill._runs(a, docs, rank)
    kernel = hybrid_kernels._runs_kernel
    runs = kernel if engine == "compiled" else getattr(kernel, "py_func", kernel)  # interpreted: the Python
    left_b = runs(b.load, b.room, b.first, b.mb, b.time, b.share, docs, rank)
    assert np.array_equal(left_a, left_b)
    assert_same(a, b)


@pytest.mark.parametrize("engine", KERNEL_ENGINES)
@settings(max_examples=60)
@given(seed=st.integers(0, 2**32 - 1))
def test_water_fill_kernel_is_the_numpy_water_fill(engine: str, seed: int) -> None:
    a, b, _ = placements(seed, engine)
    whole = np.flatnonzero(a.degree == 1)
    docs = whole[np.argsort(-a.time[whole], kind="stable")]
    if len(docs):
        hybrid_fill.water_fill(a, docs)
        hybrid_fill.water_fill(b, docs)
    assert_same(a, b)
    assert (a.first[docs] >= 0).all() and (a.room >= 0).all()


@settings(max_examples=100)
@given(st.lists(st.floats(0, 1e12), min_size=1, max_size=70), st.floats(0, 1e13))
def test_the_water_level_fills_the_shortfalls_with_the_total(loads: list[float], total: float) -> None:
    load = np.array(loads)
    level = _water_level(load, total)
    assert level == hybrid_fill._water_level(load, total)  # the kernel's is numpy's, bit for bit
    assert np.isclose(np.maximum(level - load, 0).sum(), total, rtol=1e-9, atol=1e-3)


def test_the_engine_is_numpy_unless_the_environment_opts_in_to_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    assert set(ENGINES) == {"compiled", "numpy"}
    monkeypatch.delenv("WEIR_HYBRID_ENGINE", raising=False)
    assert default_engine() == "numpy"
    monkeypatch.setenv("WEIR_HYBRID_ENGINE", "compiled")
    assert default_engine() == "compiled"
    monkeypatch.setenv("WEIR_HYBRID_ENGINE", "fast")
    with pytest.raises(ValueError, match="WEIR_HYBRID_ENGINE"):
        default_engine()
    assert kernels("numpy") is None and kernels("interpreted") is not None
    with pytest.raises(ValueError, match="unknown hybrid engine"):
        kernels("fast")
    if not HAS_NUMBA:
        with pytest.raises(ValueError, match="needs numba"):
            kernels("compiled")


def test_without_numba_the_deal_runs_on_numpy_and_is_the_same() -> None:
    """A training node without numba: the loaders import, the engine is numpy, the deal the compiled one's."""
    rng = np.random.default_rng(3)
    lengths = np.minimum((rng.pareto(1.1, 3000) * 150 + 1).astype(np.int64), 8192)
    code = (
        "import sys, json; sys.modules['numba'] = None; sys.path.insert(0, sys.argv[1]); import numpy as np; "
        "from contract.cost import CostModel; from loaders.hybrid import HybridWorld, deal; "
        "from loaders.hybrid_kernels import default_engine; "
        "d = deal(np.array(json.loads(sys.argv[2])), HybridWorld(8, 8, 8192), CostModel(1.0, 8192.0), seed=5); "
        "print(json.dumps([default_engine(), d.degree.tolist(), d.first_rank.tolist(), d.micro_batch.tolist()]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(ROOT), json.dumps(lengths.tolist())],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "WEIR_HYBRID_ENGINE": ""},
    )
    engine, degree, first, mb = json.loads(out.stdout)
    assert engine == "numpy"
    here = deal(lengths, HybridWorld(8, 8, 8192), CostModel(1.0, 8192.0), seed=5)
    assert degree == here.degree.tolist() and first == here.first_rank.tolist() and mb == here.micro_batch.tolist()
