"""``mixing.pack.kernels``' searches against brute force, run by the interpreter (the compiled kernels make the same
decisions: ``test_pool.py`` holds the engines to each other): the Fenwick tree's "longest length below a bound"
and the urgent units' block counts' "longest below" and "shortest above", on random counts, bounds and edges
(empty, one length, lengths 0 and S, bounds on block edges); :data:`~mixing.pack.kernels.COMPILED` names the
kernels where numba is installed."""

from __future__ import annotations

import importlib.util

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from mixing.pack import kernels


def _py(f):  # type: ignore[no-untyped-def]
    return getattr(f, "py_func", f)  # a compiled helper's Python source, run by the interpreter


@given(
    seq_len=st.integers(1, 300),
    lengths=st.lists(st.integers(0, 300), max_size=40),
    bounds=st.lists(st.integers(0, 301), min_size=1, max_size=8),
)
def test_longest_below_matches_brute_force(seq_len: int, lengths: list[int], bounds: list[int]) -> None:
    n = seq_len + 1
    top = 1 << (n.bit_length() - 1)
    fen = np.zeros(2 * (n + 1), np.int64)  # two trees: the second one is searched, at base n + 1
    held = [ln for ln in lengths if ln <= seq_len]
    for ln in held:
        _py(kernels.fen_add)(fen, n + 1, n, ln + 1, 1)
    for bound in bounds:
        bound = min(bound, n)
        expect = max((ln for ln in held if ln < bound), default=-1)
        assert _py(kernels.longest_below)(fen, n + 1, n, top, bound) == expect


@given(
    seq_len=st.sampled_from([1, 62, 63, 64, 127, 128, 200, 1000]),
    picks=st.lists(st.integers(0, 10**6), max_size=30),
    removed=st.lists(st.integers(0, 10**6), max_size=10),
    bounds=st.lists(st.integers(-1, 1001), min_size=1, max_size=8),
)
def test_urgent_counts_search_by_blocks_like_brute_force(
    seq_len: int, picks: list[int], removed: list[int], bounds: list[int]
) -> None:
    n, k = seq_len + 1, 2
    ucnt = np.zeros(k * n, np.int64)
    ublk = np.zeros(k * (n // 64 + 1), np.int64)
    held: list[int] = []
    for p in picks:  # lengths 0..S, the edges often
        ln = p % n if p % 3 else (0, seq_len, 63 % n, 64 % n)[p % 4]
        _py(kernels.urgent_add)(ucnt, ublk, 1, n, ln, 1)
        held.append(ln)
    for r in removed:
        if held:
            ln = held.pop(r % len(held))
            _py(kernels.urgent_add)(ucnt, ublk, 1, n, ln, -1)
    assert not ucnt[:n].any() and not ublk[: n // 64 + 1].any()  # source 0 untouched
    for bound in bounds:
        below = max((ln for ln in held if ln < bound), default=-1)
        above = min((ln for ln in held if ln > bound), default=n)
        if 0 <= bound <= n:
            assert _py(kernels.urgent_below)(ucnt, ublk, 1, n, bound) == below
        if -1 <= bound < n:
            assert _py(kernels.urgent_above)(ucnt, ublk, 1, n, bound) == above
    assert _py(kernels.urgent_below)(ucnt, ublk, 0, n, n) == -1
    assert _py(kernels.urgent_above)(ucnt, ublk, 0, n, -1) == n


def test_compiled_kernels_are_named_where_numba_is_installed() -> None:
    has_numba = importlib.util.find_spec("numba") is not None
    assert set(kernels.COMPILED) == ({"add_units", "remove_units", "fill_bins"} if has_numba else set())
