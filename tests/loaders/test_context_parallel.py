"""CP splits: every slot of the sequence on exactly one rank, equal lengths, bounded padding, equal work."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.context_parallel import attention_work, document_zigzag, split


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=12), st.integers(1, 8))
def test_zigzag_covers_each_slot_once_with_bounded_padding(seg_lens: list[int], cp: int) -> None:
    parts = [document_zigzag(np.array(seg_lens), cp, r) for r in range(cp)]
    assert len({len(p) for p in parts}) == 1
    flat = np.concatenate(parts)
    assert sorted(flat[flat >= 0].tolist()) == list(range(sum(seg_lens)))
    assert (flat < 0).sum() <= (2 * cp - 1) * len(seg_lens)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(512, 8000), min_size=1, max_size=8), st.sampled_from([2, 4, 8]))
def test_zigzag_balances_causal_work(seg_lens: list[int], cp: int) -> None:
    work = [attention_work(np.array(seg_lens), document_zigzag(np.array(seg_lens), cp, r)) for r in range(cp)]
    assert max(work) / np.mean(work) <= 1.01


def test_contiguous_split_is_unbalanced_and_zigzag_fixes_it() -> None:
    seg = np.array([4096])
    work = {
        how: [attention_work(seg, split(seg, 4, r, how)) for r in range(4)]
        for how in ("contiguous", "sequence_zigzag", "zigzag")
    }
    assert max(work["contiguous"]) / np.mean(work["contiguous"]) > 1.5
    assert max(work["zigzag"]) / np.mean(work["zigzag"]) < 1.001


def test_many_short_documents_stay_balanced() -> None:
    rng = np.random.default_rng(0)
    seg = rng.integers(5, 60, 400)  # short documents: pair rotation evens out the rounding
    work = [attention_work(seg, document_zigzag(seg, 8, r)) for r in range(8)]
    assert max(work) / np.mean(work) <= 1.01
