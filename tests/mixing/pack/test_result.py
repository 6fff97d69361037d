"""``mixing.pack.result.Packing``'s derived figures: ``seq_tokens`` (int64 [n_seq]) the real tokens of each
sequence, ``seg_cost`` (float64 [n_seg]) each segment's cost under the packing's cost model, ``seq_cost`` (float64
[n_seq]) the sum of its segments' costs, the same whatever order they were placed in; a sequence of padding only
has none of either. (``PackedStep`` and ``PackStream`` are plain records.)"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.cost import CostModel
from mixing.pack.result import Packing

SEQ_LEN = 32


@st.composite
def packings(draw: st.DrawFn) -> Packing:
    seqs = draw(st.lists(st.lists(st.integers(1, 8), max_size=4), max_size=8))  # ≤ 32 tokens each
    segments = np.array(
        [(draw(st.integers(0, 2)), draw(st.integers(0, 99)), 0, ln) for lens in seqs for ln in lens], np.int64
    ).reshape(-1, 4)
    cost = CostModel(draw(st.sampled_from([0.0, 1.0, 0.25])), draw(st.sampled_from([0.0, 16.0, 3.0])))
    return Packing(
        sources=("a", "b", "c"),
        seq_len=SEQ_LEN,
        seq_step=np.arange(len(seqs), dtype=np.int64) // 2,
        seg_offsets=np.concatenate([[0], np.cumsum([len(s) for s in seqs])]).astype(np.int64),
        segments=segments,
        dropped=np.zeros((0, 4), np.int64),
        cost=cost,
    )


def per_sequence(p: Packing) -> list[list[int]]:
    return [p.segments[a:b, 3].tolist() for a, b in zip(p.seg_offsets[:-1], p.seg_offsets[1:], strict=True)]


@given(p=packings())
def test_figures_are_per_sequence_sums_of_the_segments(p: Packing) -> None:
    n_seq, n_seg = len(p.seq_step), len(p.segments)
    att, lin = p.cost.attention, p.cost.linear
    assert p.seq_tokens.dtype == np.int64 and p.seq_tokens.shape == (n_seq,)
    assert p.seg_cost.dtype == np.float64 and p.seg_cost.shape == (n_seg,)
    assert p.seq_cost.dtype == np.float64 and p.seq_cost.shape == (n_seq,)
    assert p.seg_cost.tolist() == [att * ln * ln + lin * ln for ln in p.segments[:, 3].tolist()]
    for i, lens in enumerate(per_sequence(p)):
        assert p.seq_tokens[i] == sum(lens) <= p.seq_len
        assert p.seq_cost[i] == pytest.approx(sum(att * ln * ln + lin * ln for ln in lens), rel=1e-12, abs=0)
        if not lens:  # padding only
            assert p.seq_tokens[i] == 0 and p.seq_cost[i] == 0.0


@given(p=packings(), seed=st.integers(0, 1000))
def test_a_sequences_cost_does_not_depend_on_the_order_of_its_segments(p: Packing, seed: int) -> None:
    rng = np.random.default_rng(seed)
    bounds = zip(p.seg_offsets[:-1].tolist(), p.seg_offsets[1:].tolist(), strict=True)
    order = np.concatenate([np.zeros(0, np.int64), *(a + rng.permutation(b - a) for a, b in bounds)])
    shuffled = dataclasses.replace(p, segments=p.segments[order.astype(np.int64)].reshape(-1, 4))
    assert shuffled.seq_cost.tolist() == p.seq_cost.tolist()  # exactly: sums taken over integers first
    assert shuffled.seq_tokens.tolist() == p.seq_tokens.tolist()


def test_a_packing_is_immutable_and_costs_attention_only_by_default() -> None:
    p = Packing(
        ("a",),
        8,
        np.zeros(1, np.int64),
        np.array([0, 2]),
        np.array([[0, 0, 0, 3], [0, 1, 0, 5]]),
        np.zeros((0, 4), np.int64),
    )
    assert p.cost == CostModel(1.0, 0.0) and p.seq_cost.tolist() == [34.0] and p.seq_tokens.tolist() == [8]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.seq_len = 16  # type: ignore[misc]
