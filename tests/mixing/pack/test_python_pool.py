"""``mixing.pack.python_pool``, the pure-Python engine's parts held to their docstrings: ``choose`` picks the longest
unit that fits among sources behind their due tokens that brings them closer (length < 2·due), else the longest
that fits from any source, ties to the source further behind, then the lower index, then the earliest planned;
``Bins.place`` puts a unit into the tightest bin that holds it (then the cheapest, then the lowest index) and
never overfills one; ``UnitPool`` keeps each source's units sorted (length, plan order) with their lengths beside
them, and ``drain`` empties it. (The ``Pool`` interface both engines share is ``test_pool.py``'s.)"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from contract.cost import CostModel
from mixing.pack.python_pool import Bins, Unit, UnitPool, choose

LENGTHS = st.integers(1, 12)
DUES = st.integers(-4, 30).map(lambda x: x / 2) | st.sampled_from([0.0, 3.0, 6.0])  # exact halves: l = 2·due edges


def oracle(lens: list[list[int]], due: list[float], free: int) -> tuple[int, int]:
    """``choose`` as its docstring words it, by brute force over every candidate."""
    fits = [(s, j, ln) for s, ls in enumerate(lens) for j, ln in enumerate(ls) if ln <= free]
    closer = [(s, j, ln) for s, j, ln in fits if due[s] > 0 and ln < 2 * due[s]]
    cands = closer or fits
    if not cands:
        return -1, -1
    s, j, _ = max(cands, key=lambda c: (c[2], due[c[0]], -c[0], -c[1]))  # longest, further behind, lower s, earliest
    return s, j


@given(
    data=st.lists(st.tuples(st.lists(LENGTHS, max_size=6), DUES), min_size=1, max_size=5),
    free=st.integers(0, 14),
)
def test_choose_is_best_fit_steered_by_the_mixture(data: list[tuple[list[int], float]], free: int) -> None:
    lens = [sorted(ls) for ls, _ in data]
    due = [d for _, d in data]
    s, j = choose(lens, due, free)
    assert (s, j) == oracle(lens, due, free)
    if s >= 0:
        assert lens[s][j] <= free and (j == 0 or lens[s][j - 1] < lens[s][j])  # the earliest of its length


def test_choose_tie_breaks() -> None:
    assert choose([[5], [5]], [3.0, 4.0], 10) == (1, 0)  # equally long: the source further behind
    assert choose([[5], [5]], [4.0, 4.0], 10) == (0, 0)  # equally behind: the lower index
    assert choose([[2, 5, 5, 5]], [9.0], 10) == (0, 1)  # equally long units of a source: the earliest planned
    assert choose([[8], [5]], [3.0, 4.0], 10) == (1, 0)  # 8 ≥ 2·3 would overshoot source 0: the 5
    assert choose([[8], [3]], [3.0, -1.0], 10) == (0, 0)  # nothing brings a source closer: the longest that fits
    assert choose([[6], [6]], [-1.0, -3.0], 10) == (0, 0)  # ... ties again to the source further behind
    assert choose([[6], [6]], [-3.0, 0.0], 10) == (1, 0)
    assert choose([[11], [12]], [9.0, 9.0], 10) == (-1, -1)  # none fits
    assert choose([[], []], [1.0, 1.0], 10) == (-1, -1)


@given(
    seq_len=st.integers(1, 20),
    n=st.integers(1, 5),
    lengths=st.lists(st.integers(1, 24), max_size=30),
    att=st.sampled_from([0.0, 1.0]),
    lin=st.sampled_from([0.0, 3.0]),
)
def test_bins_place_best_fit_and_never_overfill(
    seq_len: int, n: int, lengths: list[int], att: float, lin: float
) -> None:
    cost = CostModel(att, lin)
    bins = Bins(n, seq_len, cost)
    free, spent, placed = [seq_len] * n, [0.0] * n, []
    for k, ln in enumerate(lengths):
        assert bins.max_free == max(free)
        u: Unit = (ln, 0, k, 0, k, 0)
        fits = [b for b in range(n) if free[b] >= ln]
        assert bins.place(u) == bool(fits)
        if not fits:
            continue
        want = min(fits, key=lambda b: (free[b], spent[b], b))  # tightest, then cheapest, then lowest index
        assert bins.items[want][-1] == u
        placed.append(k)
        free[want] -= ln
        spent[want] += cost.of(ln)
    assert [seq_len - sum(u[0] for u in items) for items in bins.items] == free and min(free) >= 0
    assert sorted(u[2] for items in bins.items for u in items) == placed
    for b, items in enumerate(bins.items):  # each bin's units in placement order
        assert [u[2] for u in items] == sorted(u[2] for u in items)
        assert abs(spent[b] - cost.sequence([u[0] for u in items])) <= 1e-9 * max(1.0, spent[b])


@given(
    batches=st.lists(
        st.lists(st.tuples(LENGTHS, st.integers(0, 2), st.integers(0, 3)), max_size=8), min_size=1, max_size=4
    )
)
def test_unit_pool_keeps_each_source_sorted_and_drains_whole(batches: list[list[tuple[int, int, int]]]) -> None:
    pool = UnitPool(3)
    added: list[Unit] = []
    for step, batch in enumerate(batches):
        units: list[Unit] = [(ln, step, o, s, len(added) + i, 0) for i, (ln, s, o) in enumerate(batch)]
        pool.add(units)
        added += units
        for s in range(3):
            assert pool.units[s] == sorted(u for u in added if u[3] == s)  # by length, then plan order
            assert pool.lens[s] == [u[0] for u in pool.units[s]]
    assert sorted(pool.drain()) == sorted(added)
    assert pool.units == [[], [], []] and pool.lens == [[], [], []] and pool.drain() == []
