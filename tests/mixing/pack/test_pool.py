"""``mixing.pack.pool``: the :class:`~mixing.pack.pool.Pool` interface's contract, held on random unit sets, random
dues, random ageing and random removals by every engine ("python", the compiled kernels run by the interpreter, and
compiled where numba is installed): the same results, unit for unit; units conserved (placed + removed + drained =
added, each once); no bin overfilled; a fill stops only when the pool is empty or nothing left fits; ``placed`` is
the placed tokens per source; each fill is the one its contract words, by brute force (the urgent units, planned at
or before the step aged to, first among those that bring their source closer to its due, then first among those
that fit whatever the dues); ``held`` lists the pool in (source, step, ord, doc_id, start) order and ``remove``
takes out what its mask marks; ``drain`` empties the pool in (source, step, ord, length) order; ``make_pool`` refuses
unknown engines. (``tests/mixing/pack/test_packing_scale.py`` compares the engines through the packer.)"""

from __future__ import annotations

import importlib.util
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.cost import CostModel
from mixing.pack.pool import ENGINES, Pool, default_engine, make_pool
from mixing.pack.python_pool import Bins

HAS_NUMBA = importlib.util.find_spec("numba") is not None
ALL = ["python", "interpreted", *(["compiled"] if HAS_NUMBA else [])]
COST = CostModel(1.0, 4.0)


@dataclass
class Call:
    """One step of the packer's calls: add ``units``, age to ``age`` (if not None), remove the held units a
    generator seeded with ``remove`` picks (if not None), fill ``bins`` bins given ``want``, drain if
    ``drain``."""

    units: np.ndarray
    want: np.ndarray
    bins: int
    drain: bool
    age: int | None = None
    remove: int | None = None


@dataclass
class Scenario:
    """A phase or two of the packer's calls (a drain ends a phase, and the last step)."""

    n_src: int
    seq_len: int
    steps: list[Call] = field(default_factory=list)


@st.composite
def scenarios(draw: st.DrawFn, max_steps: int = 5, max_units: int = 12) -> Scenario:
    n_src, seq_len = draw(st.integers(1, 4)), draw(st.integers(1, 48))
    sc = Scenario(n_src, seq_len)
    ords, doc, aged = [0] * n_src, 0, -1
    for step in range(draw(st.integers(1, max_steps))):
        rows = []
        for s in sorted(draw(st.lists(st.integers(0, n_src - 1), max_size=max_units))):
            length = draw(st.integers(1, seq_len) | st.sampled_from([1, (seq_len + 1) // 2, seq_len]))  # ties, edges
            rows.append((length, s, doc, draw(st.integers(0, 3)) * seq_len, step, ords[s]))
            ords[s] += 1
            doc += 1
        units = np.array(rows, np.int64).reshape(-1, 6)
        due = st.integers(-20, 6 * seq_len) | st.sampled_from([-2, 0, 1, 2 * seq_len, 4 * seq_len])  # ties, edges
        want = np.array(draw(st.lists(due, min_size=n_src, max_size=n_src))) / 2  # some sources ahead, some behind
        age = draw(st.none() | st.integers(max(aged, step - 3), step))  # never back, never past the step
        aged = aged if age is None else age
        remove = draw(st.none() | st.integers(0, 2**16))
        call = Call(units, want.astype(np.float64), draw(st.integers(1, 4)), draw(st.booleans()), age, remove)
        sc.steps.append(call)
        if call.drain:
            aged = -1
    return sc


def fill_oracle(held: list[tuple[int, ...]], aged: int | None, want: np.ndarray, n_bins: int, seq_len: int) -> list:  # type: ignore[type-arg]
    """A fill as the contract words it, by brute force over ``held`` ((length, source, doc_id, start, step, ord)
    rows): each next unit the longest that fits among the sources behind that it brings closer (length < 2·due),
    from the urgent units (planned at or before ``aged``), else from the others; where none, the longest that fits
    whatever the dues, urgent first. Ties: the source further behind, the lower source, the earliest planned.
    Returns each bin's units as (source, doc_id, start, length), in placement order."""
    bins, due, left = Bins(n_bins, seq_len, COST), want.tolist(), list(held)
    while True:
        free, chosen = bins.max_free, None
        for closer, urgent in ((True, True), (True, False), (False, True), (False, False)):
            fits = [
                u
                for u in left
                if u[0] <= free
                and (aged is not None and u[4] <= aged) == urgent
                and (not closer or (due[u[1]] > 0 and u[0] < 2 * due[u[1]]))
            ]
            if fits:
                chosen = max(fits, key=lambda u: (u[0], due[u[1]], -u[1], -u[4], -u[5], -u[2], -u[3]))
                break
        if chosen is None:
            return [[(v[3], v[4], v[5], v[0]) for v in b] for b in bins.items]
        left.remove(chosen)
        bins.place((chosen[0], chosen[4], chosen[5], chosen[1], chosen[2], chosen[3]))
        due[chosen[1]] -= chosen[0]


def run(engine: str, sc: Scenario) -> list[tuple[str, object]]:
    """Play ``sc`` on a fresh pool of ``engine``, checking the contract at every call; return every result."""
    pool: Pool = make_pool(engine, sc.n_src, sc.seq_len, COST)
    held: Counter[tuple[int, ...]] = Counter()  # (length, source, doc_id, start, step, ord) of the pool's units
    out: list[tuple[str, object]] = []
    aged = None
    for call in sc.steps:
        pool.add(call.units)
        held.update(map(tuple, call.units.tolist()))
        assert len(pool) == held.total()
        if call.age is not None:
            pool.age(call.age)
            aged = call.age

        rows = pool.held()
        assert rows.dtype == np.int64 and rows.shape == (held.total(), 6)
        assert Counter(map(tuple, rows.tolist())) == held
        keys = [(r[1], r[4], r[5], r[2], r[3]) for r in rows.tolist()]
        assert keys == sorted(keys), "held out of (source, step, ord, doc_id, start) order"
        if call.remove is not None:
            mask = np.random.default_rng(call.remove).random(len(rows)) < 0.3
            pool.remove(mask)
            held -= Counter(map(tuple, rows[mask].tolist()))
            assert len(pool) == held.total() and Counter(map(tuple, pool.held().tolist())) == held
            out.append(("remove", rows[mask].tolist()))

        segs = np.full((len(pool), 4), -1, np.int64)
        counts = np.full(call.bins, -1, np.int64)
        expect = fill_oracle(list(held.elements()), aged, call.want, call.bins, sc.seq_len)
        m, placed = pool.fill(call.want, segs, counts)
        assert counts.sum() == m and (counts >= 0).all() and (segs[m:] == -1).all()
        got = Counter(map(tuple, segs[:m].tolist()))
        by_seg = Counter({(u[1], u[2], u[3], u[0]): c for u, c in held.items()})
        assert not got - by_seg, "placed a unit the pool did not hold (or twice)"
        for u in list(held.elements()):
            if got[(u[1], u[2], u[3], u[0])] > 0:
                got[(u[1], u[2], u[3], u[0])] -= 1
                held[u] -= 1
        held += Counter()  # drop zero counts
        assert len(pool) == held.total()
        bin_of = np.repeat(np.arange(call.bins), counts)
        used = np.bincount(bin_of, weights=segs[:m, 3], minlength=call.bins)
        assert (used <= sc.seq_len).all(), "a bin overfilled"
        assert placed.dtype == np.float64 and placed.shape == (sc.n_src,)
        assert placed.tolist() == np.bincount(segs[:m, 0], weights=segs[:m, 3], minlength=sc.n_src).tolist()
        if held:  # it stopped early only because nothing left fits in any bin
            assert min(u[0] for u in held) > sc.seq_len - used.min()
        bins = np.split(segs[:m], np.cumsum(counts)[:-1])
        assert [list(map(tuple, b.tolist())) for b in bins] == expect, "not the fill the contract words"
        out.append(("fill", (m, placed.tolist(), counts.tolist(), segs[:m].tolist())))

        if call.drain:
            out.append(("drain", drain(pool, held)))
            aged = None
    out.append(("drain", drain(pool, held)))
    assert len(pool) == 0 and pool.drain().shape == (0, 6)
    return out


def drain(pool: Pool, held: Counter[tuple[int, ...]]) -> list:  # type: ignore[type-arg]
    left = pool.drain()
    assert left.dtype == np.int64 and left.shape == (held.total(), 6) and len(pool) == 0
    rows = list(map(tuple, left.tolist()))
    assert Counter(rows) == held  # every unit placed, removed or left once: conserved
    keys = [(r[1], r[4], r[5], r[0], r[2], r[3]) for r in rows]
    assert keys == sorted(keys), "drained out of (source, step, ord, length) order"
    held.clear()
    return rows


@settings(max_examples=60, deadline=None)
@given(sc=scenarios())
def test_every_engine_keeps_the_contract_and_gives_the_same_results(sc: Scenario) -> None:
    results = {engine: run(engine, sc) for engine in ALL}
    for engine in ALL[1:]:
        assert results[engine] == results["python"], engine


@pytest.mark.parametrize("seed", [0, 1])
def test_engines_agree_on_pools_larger_than_their_first_allocation(seed: int) -> None:
    """Thousands of units over several adds, ageings, removals, fills and drains: the compiled pool grows its
    slots and its ring of units to age, and reuses them."""
    rng = np.random.default_rng(seed)
    sc = Scenario(n_src=3, seq_len=256)
    ords, doc = [0, 0, 0], 0
    for step in range(8):
        n = int(rng.integers(300, 900))
        src = np.sort(rng.integers(0, 3, n))
        length = np.minimum(rng.lognormal(3.5, 1.0, n).astype(np.int64) + 1, 256)
        rows = []
        for s, ln in zip(src.tolist(), length.tolist(), strict=True):
            rows.append((ln, s, doc, 0, step, ords[s]))
            ords[s], doc = ords[s] + 1, doc + 1
        want = rng.uniform(-100, 256 * 16, 3)
        age = step - 2 if step not in (3, 4, 6) else None  # ageing resumes after the drains
        remove = step if step in (2, 5) else None
        sc.steps.append(Call(np.array(rows, np.int64), want, int(rng.integers(8, 24)), step in (2, 5), age, remove))
    results = {engine: run(engine, sc) for engine in ALL}
    assert any(kind == "drain" and rows for kind, rows in results["python"])  # units were left at phase ends
    for engine in ALL[1:]:
        assert results[engine] == results["python"], engine


def test_a_pool_without_ageing_refuses_to_age() -> None:
    for engine in ALL:
        pool = make_pool(engine, 2, 16, COST, ageing=False)
        pool.add(np.array([(3, 0, 0, 0, 0, 0)], np.int64))
        with pytest.raises(ValueError, match="without ageing"):
            pool.age(0)


def test_make_pool_names_its_engines_and_refuses_others() -> None:
    assert set(ENGINES) == {"compiled", "python"}
    assert default_engine() == ("compiled" if HAS_NUMBA else "python")
    for engine in ALL:
        assert len(make_pool(engine, 2, 16, COST)) == 0
    with pytest.raises(ValueError, match=r"^unknown packing engine 'numpy'; one of \('compiled', 'python'\)"):
        make_pool("numpy", 2, 16, COST)
