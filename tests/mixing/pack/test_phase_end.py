"""``mixing.pack.phase_end``: the drop priority is a fixed function of a unit's (source, doc_id, start, ord), blind to
its length and step; ``set_aside`` takes per source a prefix of the (latest step, priority) order, never passes a
target with ``"under"``, passes the targets' total by at most ``slack`` with ``"dither"``, and does not depend on
the rows' order; a pool's ``take_all`` gives back units that pack as the pool would have; and what a phase end drops
is not chosen by length (every engine alike), where the packing without the choice drops the shortest units; where the
phase holds continuation pieces of long documents, they stand in for whole documents: every document planned in a
phase reaches one of its steps (``keep_whole``)."""

from __future__ import annotations

import importlib.util
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.cost import CostModel
from mixing.pack.packing import pack_units
from mixing.pack.phase_end import keep_whole, priority, set_aside
from mixing.pack.pool import make_pool
from mixing.pack.result import Packing

S = 512
ALL = ["python", "interpreted", *(["compiled"] if importlib.util.find_spec("numba") else [])]  # every engine


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
    rank = np.argsort(np.argsort(p))
    assert abs(np.corrcoef(rank, u[:, 0])[0, 1]) < 0.1  # not ordered by length


@settings(max_examples=60)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 300),
    targets=st.lists(st.floats(0, 20000), min_size=3, max_size=3),
    rule=st.sampled_from(["dither", "under"]),
    slack=st.sampled_from([0.0, 300.0, 1e9]),
    since=st.integers(0, 2),
)
def test_set_aside_keeps_to_the_targets(
    seed: int, n: int, targets: list[float], rule: str, slack: float, since: int
) -> None:
    u = _units(seed, n)
    t = np.array(targets)
    mask = set_aside(u, t, rule=rule, since=since, slack=slack)
    assert mask.dtype == np.bool_ and mask.shape == (n,)
    assert (u[mask, 4] >= since).all()  # only units planned at ``since`` or later
    got = np.bincount(u[mask, 1], weights=u[mask, 0], minlength=3)
    if rule == "under":
        assert (got <= t + 1e-9).all()
    else:  # each source passes its target by less than one unit, the total its by at most ``slack``
        assert got.sum() <= t.sum() + slack + 1e-6 and (got < t + 500).all()
    for s in range(3):  # the longest prefix of its (latest step, priority) order that fits the target, at least
        mine = np.flatnonzero((u[:, 1] == s) & (u[:, 4] >= since))
        order = mine[np.lexsort((priority(u[mine]), -u[mine, 4]))]
        fits = np.cumsum(u[order, 0]) <= t[s]
        assert mask[order[: int(np.argmin(fits)) if not fits.all() else len(order)]].all()
    perm = np.random.default_rng(seed).permutation(n)
    assert np.array_equal(set_aside(u[perm], t, rule=rule, since=since, slack=slack), mask[perm])


@pytest.mark.parametrize("engine", ALL)
def test_take_all_gives_back_units_that_pack_as_the_pool_would(engine: str) -> None:
    u = _units(5, 600)
    u = u[np.lexsort((u[:, 3], u[:, 2], u[:, 5], u[:, 1], u[:, 4]))]
    a, b = make_pool(engine, 3, S, CostModel()), make_pool(engine, 3, S, CostModel())
    for step in range(3):
        a.add(u[u[:, 4] == step])
        b.add(u[u[:, 4] == step])
    rows = b.take_all()
    assert len(b) == 0 and Counter(map(tuple, rows.tolist())) == Counter(map(tuple, u.tolist()))
    assert np.array_equal(rows, u)  # ordered by (step, source, ord, doc_id, start)
    b.add(rows)
    want = np.array([30000.0, 20000.0, 10000.0])
    out = []
    for pool in (a, b):
        segs, counts = np.zeros((len(pool), 4), np.int64), np.zeros(16, np.int64)
        n, placed = pool.fill(want, segs, counts)
        out.append((segs[:n].tolist(), counts.tolist(), placed.tolist(), pool.drain().tolist()))
    assert out[0] == out[1]


def _drawn_plan(
    seed: int, n_steps: int, batch: int, shares: tuple[float, float, float], books: bool
) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Two phases of three sources (S=512, ``batch`` sequences a step), drawn as the planner draws: per source,
    whole documents until its drawn tokens reach its cumulative quota, so each phase's surplus is less than a
    document per source. Short documents are lognormal (median ~34 tokens); with ``books``, source 0 draws
    books of 1-6 S instead, each S-piece a unit (``start`` = k·S)."""
    rng = np.random.default_rng(seed)
    rows, doc, ords = [], 0, [0, 0, 0]
    steps = [(s, "a" if s < n_steps // 2 else "b") for s in range(n_steps)]
    drawn, q_cum = np.zeros(3), np.zeros(3)
    for step in range(n_steps):
        if step == n_steps // 2:
            drawn[:], q_cum[:] = 0.0, 0.0
        q_cum += np.array(shares) * S * batch
        for src in range(3):
            while drawn[src] < q_cum[src]:
                n = int(rng.integers(S, 6 * S)) if books and src == 0 else int(min(rng.lognormal(3.5, 1.0) + 1, S))
                for start in range(0, n, S):
                    rows.append((min(S, n - start), src, doc, start, step, ords[src]))
                    ords[src] += 1
                doc, drawn[src] = doc + 1, drawn[src] + n
    return np.array(rows, dtype=np.int64), steps


def _steady_plan(seed: int) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Two phases of 60 steps of short documents only, 8 sequences, shares 0.5, 0.3, 0.2."""
    return _drawn_plan(seed, 120, 8, (0.5, 0.3, 0.2), books=False)


def _packed(units: np.ndarray, steps: list[tuple[int, str]], fair_drops: bool) -> Packing:
    out = [pack_units(units, steps, ("x", "y", "z"), S, 8, engine=e, fair_drops=fair_drops) for e in ALL]
    for p in out[1:]:  # every engine alike, unit for unit
        for f in ("seq_step", "seg_offsets", "segments", "dropped"):
            assert np.array_equal(getattr(p, f), getattr(out[0], f)), f
    p = out[0]
    assert Counter(map(tuple, np.concatenate([p.segments, p.dropped]).tolist())) == Counter(
        map(tuple, units[:, [1, 2, 3, 0]].tolist())
    )
    return p


def _percentiles(p: Packing, units: np.ndarray) -> np.ndarray:
    """Each dropped unit's length percentile among its source's planned units (mid-rank: ties count half)."""
    out = np.zeros(len(p.dropped))
    for s in range(3):
        mine, lengths = p.dropped[:, 0] == s, np.sort(units[units[:, 1] == s, 0])
        below = np.searchsorted(lengths, p.dropped[mine, 3], "left")
        out[mine] = (below + np.searchsorted(lengths, p.dropped[mine, 3], "right")) / 2 / len(lengths)
    return out


def test_what_a_phase_end_drops_is_not_chosen_by_length() -> None:
    plans = [_steady_plan(seed) for seed in range(1, 9)]
    fair = [_packed(u, st, True) for u, st in plans]
    by_length = [_packed(u, st, False) for u, st in plans]
    pf = np.concatenate([_percentiles(p, u) for p, (u, _st) in zip(fair, plans, strict=True)])
    pb = np.concatenate([_percentiles(p, u) for p, (u, _st) in zip(by_length, plans, strict=True)])
    # without the choice: what a phase end drops is its sources' shortest units (mean percentile ~0.05)
    assert len(pb) > 200 and (pb < 0.2).mean() > 0.8 and pb.mean() < 0.15, (len(pb), pb.mean())
    # with it: a length-blind sample (mean ~0.5), as many tokens, no more padding than a few tokens per phase end
    assert len(pf) > 20 and 0.35 < pf.mean() < 0.65 and (pf < 0.1).mean() < 0.25, (len(pf), pf.mean())
    for f, b in zip(fair, by_length, strict=True):
        assert f.seq_tokens.sum() >= b.seq_tokens.sum() - 0.02 * 2 * 2 * S * 8  # PAD_TOL, two phase ends


@settings(max_examples=40)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 300),
    targets=st.lists(st.floats(0, 5000), min_size=3, max_size=3),
    move=st.sampled_from([0.0, 200.0, np.inf]),
)
def test_keep_whole_sets_aside_pieces_before_whole_units(seed: int, n: int, targets: list[float], move: float) -> None:
    u = _units(seed, n)
    t = np.array(targets)
    mask = keep_whole(u, t, since=0, slack=300.0, move=move)
    assert np.array_equal(keep_whole(u[::-1], t, since=0, slack=300.0, move=move), mask[::-1])  # order-blind
    piece = u[:, 3] > 0
    aside = np.bincount(u[mask, 1], weights=u[mask, 0], minlength=3)
    by_pieces = np.bincount(u[mask & piece, 1], weights=u[mask & piece, 0], minlength=3)
    assert aside.sum() <= t.sum() + 300.0 + 1e-6
    for s in range(3):  # whole units stand in only for what the pieces set aside fall short of
        whole = np.bincount(u[mask & ~piece, 1], weights=u[mask & ~piece, 0], minlength=3)
        assert whole[s] == 0 or (not move and by_pieces[s] < t[s]) or (move > 0 and by_pieces.sum() < t.sum()), s
    pieces_only = _units(seed, n)
    pieces_only[:, 3] = 512  # every unit a continuation piece: never anything else, and the plain choice's total
    m2 = keep_whole(pieces_only, t, since=0, slack=300.0, move=0.0)
    assert np.array_equal(m2, set_aside(pieces_only, t, rule="dither", since=0, slack=300.0))


def _plan_with_books(seed: int) -> tuple[np.ndarray, list[tuple[int, str]]]:
    """Two phases of 64 steps of 128 sequences, shares 0.4, 0.4, 0.2, source 0's documents books."""
    return _drawn_plan(seed, 128, 128, (0.4, 0.4, 0.2), books=True)


def _lost(p: Packing, units: np.ndarray, steps: list[tuple[int, str]]) -> int:
    """Documents (source, doc_id) planned in a phase that none of its steps delivered."""
    phase = dict(steps)
    seg_step = np.repeat(p.seq_step, np.diff(p.seg_offsets)).tolist()
    got = {(s, d, phase[t]) for (s, d), t in zip(p.segments[:, :2].tolist(), seg_step, strict=True)}
    planned = {(s, d, phase[t]) for s, d, t in units[:, [1, 2, 4]].tolist()}
    return len(planned - got)


def test_a_phase_end_drops_no_document_whole_where_pieces_can_stand_in() -> None:
    # phases of 4 M tokens, 10-step windows of 655 k: moving the short sources' surplus onto the books' pieces moves
    # each source by far less than SHIFT_TOL of the phase and WINDOW_TOL of its last window, as on real builds
    plans = [_plan_with_books(seed) for seed in range(1, 4)]
    kw = {"sources": ("x", "y", "z"), "seq_len": S, "global_batch": 128}
    fair = [pack_units(u, sp, **kw) for u, sp in plans]  # type: ignore[arg-type]
    by_length = [pack_units(u, sp, **kw, fair_drops=False) for u, sp in plans]  # type: ignore[arg-type]
    assert sum(_lost(p, u, sp) for p, (u, sp) in zip(by_length, plans, strict=True)) > 10  # the shortest, whole
    for p, b, (u, sp) in zip(fair, by_length, plans, strict=True):
        assert len(p.dropped) and _lost(p, u, sp) == 0
        assert (p.dropped[:, 2] > 0).all()  # only continuation pieces
        assert p.seq_tokens.sum() >= b.seq_tokens.sum() - 0.0005 * 2 * 64 * S * 128  # PAD_TOL, two phase ends
