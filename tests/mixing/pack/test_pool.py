"""``mixing.pack.pool``: the :class:`~mixing.pack.pool.Pool` interface's contract, held on random unit sets and
random dues by every engine ("python", the compiled kernels run by the interpreter, and compiled where numba is
installed): the same fill and drain results, unit for unit; units conserved (placed + drained = added, each once);
no bin overfilled; a fill stops only when the pool is empty or nothing left fits; ``placed`` is the placed tokens
per source; ``drain`` empties the pool in (source, step, ord, length) order; ``make_pool`` refuses unknown engines.
(``tests/mixing/pack/test_packing_scale.py`` compares the engines through the packer.)"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.cost import CostModel
from mixing.pack.pool import ENGINES, Pool, default_engine, make_pool

ROOT = Path(__file__).resolve().parents[3]
HAS_NUMBA = importlib.util.find_spec("numba") is not None
ALL = ["python", "interpreted", *(["compiled"] if HAS_NUMBA else [])]
COST = CostModel(1.0, 4.0)


@dataclass
class Scenario:
    """A phase or two of the packer's calls: per step, units to add, then a fill of some bins with some dues;
    a drain where a phase ends (and at the end)."""

    n_src: int
    seq_len: int
    steps: list[tuple[np.ndarray, np.ndarray, int, bool]] = field(default_factory=list)  # units, want, bins, drain


@st.composite
def scenarios(draw: st.DrawFn, max_steps: int = 5, max_units: int = 12) -> Scenario:
    n_src, seq_len = draw(st.integers(1, 4)), draw(st.integers(1, 48))
    sc = Scenario(n_src, seq_len)
    ords, doc = [0] * n_src, 0
    for step in range(draw(st.integers(1, max_steps))):
        rows = []
        for s in sorted(draw(st.lists(st.integers(0, n_src - 1), max_size=max_units))):
            length = draw(st.integers(1, seq_len) | st.sampled_from([1, (seq_len + 1) // 2, seq_len]))  # ties, edges
            rows.append((length, s, doc, draw(st.integers(0, 3)) * seq_len, step, ords[s]))
            ords[s] += 1
            doc += 1
        units = np.array(rows, np.int64).reshape(-1, 6)
        due = st.integers(-20, 6 * seq_len) | st.sampled_from([-2, 0, 2 * seq_len, 4 * seq_len])  # ties often
        want = np.array(draw(st.lists(due, min_size=n_src, max_size=n_src))) / 2
        sc.steps.append((units, want.astype(np.float64), draw(st.integers(1, 4)), draw(st.booleans())))
    return sc


def run(engine: str, sc: Scenario) -> list[tuple[str, object]]:
    """Play ``sc`` on a fresh pool of ``engine``, checking the contract at every call; return every result."""
    pool: Pool = make_pool(engine, sc.n_src, sc.seq_len, COST)
    held: Counter[tuple[int, ...]] = Counter()  # (source, doc_id, start, length) of the units in the pool
    order: dict[tuple[int, ...], tuple[int, ...]] = {}  # unit → (source, step, ord, length)
    out: list[tuple[str, object]] = []
    for units, want, n_bins, phase_ends in sc.steps:
        pool.add(units)
        for u in units.tolist():
            key = (u[1], u[2], u[3], u[0])
            held[key] += 1
            order[key] = (u[1], u[4], u[5], u[0])
        assert len(pool) == held.total()

        segs = np.full((len(pool), 4), -1, np.int64)
        counts = np.full(n_bins, -1, np.int64)
        m, placed = pool.fill(want, segs, counts)
        assert counts.sum() == m and (counts >= 0).all() and (segs[m:] == -1).all()
        got = Counter(map(tuple, segs[:m].tolist()))
        assert not got - held, "placed a unit the pool did not hold (or twice)"
        held -= got
        assert len(pool) == held.total()
        bin_of = np.repeat(np.arange(n_bins), counts)
        used = np.bincount(bin_of, weights=segs[:m, 3], minlength=n_bins)
        assert (used <= sc.seq_len).all(), "a bin overfilled"
        assert placed.dtype == np.float64 and placed.shape == (sc.n_src,)
        assert placed.tolist() == np.bincount(segs[:m, 0], weights=segs[:m, 3], minlength=sc.n_src).tolist()
        if held:  # it stopped early only because nothing left fits in any bin
            assert min(k[3] for k in held) > sc.seq_len - used.min()
        out.append(("fill", (m, placed.tolist(), counts.tolist(), segs[:m].tolist())))

        if phase_ends:
            out.append(("drain", drain(pool, held, order)))
    out.append(("drain", drain(pool, held, order)))
    assert len(pool) == 0 and pool.drain().shape == (0, 4)
    return out


def drain(pool: Pool, held: Counter[tuple[int, ...]], order: dict[tuple[int, ...], tuple[int, ...]]) -> list:  # type: ignore[type-arg]
    left = pool.drain()
    assert left.dtype == np.int64 and left.shape == (held.total(), 4) and len(pool) == 0
    rows = list(map(tuple, left.tolist()))
    assert Counter(rows) == held  # every unit placed once or left once: conserved
    keys = [order[r] for r in rows]
    assert keys == sorted(keys), "drained out of (source, step, ord, length) order"
    held.clear()
    return rows


@settings(max_examples=60)
@given(sc=scenarios())
def test_every_engine_keeps_the_contract_and_gives_the_same_results(sc: Scenario) -> None:
    results = {engine: run(engine, sc) for engine in ALL}
    for engine in ALL[1:]:
        assert results[engine] == results["python"], engine


@pytest.mark.parametrize("seed", [0, 1])
def test_engines_agree_on_pools_larger_than_their_first_allocation(seed: int) -> None:
    """Thousands of units over several adds, fills and drains: the compiled pool grows and reuses its slots."""
    rng = np.random.default_rng(seed)
    sc = Scenario(n_src=3, seq_len=256)
    ords, doc = [0, 0, 0], 0
    for step in range(6):
        n = int(rng.integers(300, 900))
        src = np.sort(rng.integers(0, 3, n))
        length = np.minimum(rng.lognormal(3.5, 1.0, n).astype(np.int64) + 1, 256)
        rows = []
        for s, ln in zip(src.tolist(), length.tolist(), strict=True):
            rows.append((ln, s, doc, 0, step, ords[s]))
            ords[s], doc = ords[s] + 1, doc + 1
        want = rng.uniform(-100, 256 * 16, 3)
        sc.steps.append((np.array(rows, np.int64), want, int(rng.integers(8, 24)), step in (2, 4)))
    results = {engine: run(engine, sc) for engine in ALL}
    assert any(kind == "drain" and rows for kind, rows in results["python"])  # units were left at phase ends
    for engine in ALL[1:]:
        assert results[engine] == results["python"], engine


def test_make_pool_names_its_engines_and_refuses_others() -> None:
    assert set(ENGINES) == {"compiled", "python"}
    assert default_engine() == ("compiled" if HAS_NUMBA else "python")
    for engine in ALL:
        assert len(make_pool(engine, 2, 16, COST)) == 0
    with pytest.raises(ValueError, match=r"^unknown packing engine 'numpy'; one of \('compiled', 'python'\)"):
        make_pool("numpy", 2, 16, COST)


@pytest.mark.skipif(not HAS_NUMBA, reason="numba is not installed: no compiled engine")
def test_numba_is_imported_by_the_first_compiled_pool_and_its_kernels_made_once() -> None:
    # in a fresh interpreter: pools made by 8 threads at once share one pair of kernels, and they pack
    code = """\
import sys, threading
import numpy as np
from contract.cost import CostModel
from mixing.pack.pool import make_pool
assert "numba" not in sys.modules
pools, barrier = [], threading.Barrier(8)
def made():
    barrier.wait()
    pools.append(make_pool("compiled", 2, 16, CostModel(1.0, 4.0)))
threads = [threading.Thread(target=made) for _ in range(8)]
[t.start() for t in threads]
[t.join() for t in threads]
assert "numba" in sys.modules and len(pools) == 8
assert len({(id(p.add_kernel), id(p.fill_kernel)) for p in pools}) == 1
pools[0].add(np.array([[5, 0, 0, 0, 0, 0], [9, 1, 1, 0, 0, 0]], np.int64))
print(pools[0].fill(np.array([5.0, 9.0]), np.zeros((8, 4), np.int64), np.zeros(2, np.int64))[0])
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "2", r.stdout
