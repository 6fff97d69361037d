"""``draw_source``, the draw of one source's units against its segments' cumulative quotas: units tile their
documents in S-token pieces, none is drawn twice, a segment draws only documents within its limit and takes a
prefix of what earlier segments left, through every step the tokens drawn stay within half a unit of the quota,
units come out in (step, ord) order, and the result is deterministic and independent of :data:`CHUNK_DOCS`.

The order is a seeded permutation per epoch standing in for :class:`mixing.plan.order.SortedOrder` (its own
test: test_order.py); the planner over DuckDB: test_curriculum_plan.py and test_plan.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mixing.plan.draws as draws
from mixing.plan.draws import SegmentQuota, draw_source

COLUMNS = ("step", "doc_id", "piece", "start", "length", "epoch", "ord")


@dataclass(frozen=True)
class Case:
    """A source (``lengths`` by doc_id, a seeded order per epoch) and its segments' per-step quotas."""

    lengths: np.ndarray
    seed: int
    seq: int
    epochs: int
    limits: tuple[int | None, ...]
    quotas: tuple[np.ndarray, ...]  # per segment: tokens per step of the segment (0 allowed)

    def order(self, epoch: int, chunk: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """A :data:`~mixing.plan.order.DrawOrder`: a fresh permutation per epoch, read ``chunk`` documents at a time."""
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.lengths)).astype(np.int64)
        for lo in range(0, len(perm), chunk):
            ids = perm[lo : lo + chunk]
            yield ids, self.lengths[ids]

    def segments(self) -> list[SegmentQuota]:
        out, first = [], 0
        for limit, q in zip(self.limits, self.quotas, strict=True):
            pos = np.flatnonzero(q > 0)
            out.append(SegmentQuota(limit, (first + pos).astype(np.int64), 2 * np.cumsum(q)[pos].astype(np.int64)))
            first += len(q)
        return out

    def draw(self) -> list[dict[str, np.ndarray]]:
        """Every chunk ``draw_source`` yields, as a list (``segment`` added: which segment's steps it is in)."""
        chunks = list(
            draw_source(self.order, len(self.lengths), seq=self.seq, epochs=self.epochs, segments=self.segments())
        )
        bounds = np.cumsum([len(q) for q in self.quotas])
        for c in chunks:
            assert set(c) == set(COLUMNS) and len({len(v) for v in c.values()}) == 1
            assert all(v.dtype == np.int64 for v in c.values()), {k: v.dtype for k, v in c.items()}
            c["segment"] = np.searchsorted(bounds, c["step"], side="right")
        return chunks


@st.composite
def cases(draw: st.DrawFn) -> Case:
    seq = draw(st.sampled_from([4, 8, 16]))
    n = draw(st.integers(0, 60))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(1, 3 * seq + 1, n).astype(np.int64)
    k = draw(st.integers(1, 3))
    limits = tuple(draw(st.sampled_from([None, seq // 2, seq, 2 * seq])) for _ in range(k))
    quotas = tuple(rng.integers(0, 3 * seq, draw(st.integers(0, 12))).astype(np.int64) for _ in range(k))
    return Case(lengths, draw(st.integers(0, 1000)), seq, draw(st.integers(0, 3)), limits, quotas)


def concat(chunks: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    keys = (*COLUMNS, "segment")
    return {k: np.concatenate([c[k] for c in chunks]) if chunks else np.zeros(0, np.int64) for k in keys}


def eligible(every: dict[str, np.ndarray], taken: np.ndarray, limit: int | None) -> np.ndarray:
    """The ords a segment with ``limit`` may draw once earlier segments took ``taken``, in order."""
    return np.flatnonzero(~taken & (every["doc_len"] <= (limit if limit is not None else 1 << 62)))


def full_order(case: Case) -> dict[str, np.ndarray]:
    """Every unit of the order across ``case.epochs`` epochs, in order (its index is the unit's ``ord``): each
    epoch's documents (fewer than one spread block here), the pieces of document ``r`` of ``n`` placed at
    ``⌊r + p·n/pieces⌋ mod n``, ties by document then piece."""
    cols: dict[str, list[int]] = {"doc_id": [], "piece": [], "start": [], "length": [], "epoch": [], "doc_len": []}
    for e in range(case.epochs):
        for ids, lens in case.order(e, max(1, len(case.lengths))):
            n_docs, units = len(ids), []
            for r, (d, n) in enumerate(zip(ids.tolist(), lens.tolist(), strict=True)):
                pieces = max(1, -(-n // case.seq))
                for p in range(pieces):
                    units.append(((r * pieces + p * n_docs) // pieces % n_docs, r, p, d, n))
            for _place, _r, p, d, n in sorted(units):
                for key, v in zip(cols, (d, p, p * case.seq, min(case.seq, n - p * case.seq), e, n), strict=True):
                    cols[key].append(v)
    return {k: np.array(v, np.int64) for k, v in cols.items()}


@settings(max_examples=120)
@given(cases())
def test_units_are_the_orders_pieces_each_once_within_each_segments_limit(case: Case) -> None:
    u = concat(case.draw())
    every = full_order(case)
    # a unit is the piece of the order its ord names: same document, piece, start, length, epoch
    for key in ("doc_id", "piece", "start", "length", "epoch"):
        assert np.array_equal(u[key], every[key][u["ord"]]), key
    assert (u["length"] >= 1).all() and (u["length"] <= case.seq).all()
    assert (u["epoch"] < case.epochs).all()
    assert len(np.unique(u["ord"])) == len(u["ord"]), "no unit drawn twice"
    for s, limit in enumerate(case.limits):
        mine = u["segment"] == s
        if limit is not None:
            assert (every["doc_len"][u["ord"][mine]] <= limit).all(), f"segment {s} drew past its limit {limit}"


@settings(max_examples=120)
@given(cases())
def test_each_segment_takes_a_prefix_of_what_earlier_segments_left(case: Case) -> None:
    u = concat(case.draw())
    every = full_order(case)
    taken = np.zeros(len(every["doc_id"]), bool)
    for s, limit in enumerate(case.limits):
        mine = np.sort(u["ord"][u["segment"] == s])
        assert np.array_equal(mine, eligible(every, taken, limit)[: len(mine)]), f"segment {s} skipped a unit"
        taken[mine] = True


@settings(max_examples=120)
@given(cases())
def test_through_every_step_the_tokens_drawn_are_within_half_a_unit_of_the_quota(case: Case) -> None:
    u = concat(case.draw())
    every = full_order(case)
    order = np.lexsort((u["ord"], u["step"]))
    assert np.array_equal(order, np.arange(len(order))), "units come out in (step, ord) order"
    taken = np.zeros(len(every["doc_id"]), bool)
    for s, seg in enumerate(case.segments()):
        mine = u["segment"] == s
        assert np.isin(u["step"][mine], seg.steps).all(), "units only on steps with a positive quota"
        drawn = np.array([u["length"][mine & (u["step"] <= t)].sum() for t in seg.steps], np.int64)
        ran_out = int(mine.sum()) == len(eligible(every, taken, case.limits[s]))  # took every unit it may
        taken[u["ord"][mine]] = True
        for t, got, want2 in zip(seg.steps.tolist(), drawn.tolist(), seg.cum2.tolist(), strict=True):
            assert 2 * got < want2 + case.seq, (s, t, got, want2 / 2)  # never ahead by half a unit
            if not ran_out:
                assert 2 * got >= want2 - case.seq, (s, t, got, want2 / 2)  # never behind by more than half


@settings(max_examples=40)
@given(cases(), st.integers(1, 7))
def test_the_draw_is_deterministic_and_independent_of_the_chunk(case: Case, chunk: int) -> None:
    whole = concat(case.draw())
    again = concat(case.draw())
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(draws, "CHUNK_DOCS", chunk)
        chunked = concat(case.draw())
    for key in COLUMNS:
        assert np.array_equal(whole[key], again[key]) and np.array_equal(whole[key], chunked[key]), key


def test_nothing_is_drawn_without_epochs_documents_or_steps() -> None:
    case = Case(np.array([5, 9, 30], np.int64), 1, 8, 2, (None,), (np.array([10, 10, 10], np.int64),))
    assert len(concat(case.draw())["ord"]) > 0
    seg = case.segments()
    assert list(draw_source(case.order, 3, seq=8, epochs=0, segments=seg)) == []
    assert list(draw_source(case.order, 0, seq=8, epochs=2, segments=seg)) == []
    empty = SegmentQuota(None, np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert list(draw_source(case.order, 3, seq=8, epochs=2, segments=[empty])) == []


def test_a_segment_that_runs_out_draws_every_unit_it_may_and_no_more() -> None:
    """Documents of 5, 9 and 30 tokens (S = 8: 1 + 2 + 4 units, 44 tokens an epoch), 2 epochs, against a quota
    of 200: every unit of both epochs is drawn once, and the last steps get nothing."""
    case = Case(np.array([5, 9, 30], np.int64), 3, 8, 2, (None,), (np.full(10, 20, np.int64),))
    u = concat(case.draw())
    assert int(u["length"].sum()) == 88 and len(u["ord"]) == 14
    assert sorted(zip(u["epoch"].tolist(), u["doc_id"].tolist(), u["piece"].tolist(), strict=True)) == sorted(
        (e, d, p) for e in range(2) for d, n in ((0, 1), (1, 2), (2, 4)) for p in range(n)
    )
    assert int(u["step"].max()) == 4  # the last unit's midpoint (≥ 84) is past step 3's cumulative 80, within 100


@settings(max_examples=120)
@given(cases(), st.integers(0, 2**32 - 1))
def test_a_deferred_unit_is_drawn_past_its_step_once_and_the_rest_as_without_it(case: Case, seed: int) -> None:
    plain = concat(case.draw())
    rng = np.random.default_rng(seed)
    pick = rng.random(len(plain["ord"])) < 0.2
    deferred = dict(zip(plain["ord"][pick].tolist(), plain["step"][pick].tolist(), strict=True))
    chunks = list(
        draw_source(
            case.order, len(case.lengths), seq=case.seq, epochs=case.epochs, segments=case.segments(), deferred=deferred
        )
    )
    u = {k: np.concatenate([c[k] for c in chunks]) if chunks else np.zeros(0, np.int64) for k in COLUMNS}
    assert len(np.unique(u["ord"])) == len(u["ord"]), "no unit drawn twice"
    assert (np.diff(u["step"]) >= 0).all(), "units come out in step order"
    for o, t in zip(u["ord"].tolist(), u["step"].tolist(), strict=True):
        assert o not in deferred or t > deferred[o], (o, t, deferred[o])
    # in the first segment, the units ahead of the first deferred one are drawn as without it, on the same steps
    first, steps0 = min(deferred, default=1 << 62), len(case.quotas[0])
    early = (plain["ord"] < first) & (plain["step"] < steps0)
    mine = (u["ord"] < first) & (u["step"] < steps0)
    assert np.array_equal(plain["ord"][early], u["ord"][mine]) and np.array_equal(plain["step"][early], u["step"][mine])
