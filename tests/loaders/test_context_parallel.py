"""CP splits: every slot of the sequence on exactly one rank, equal lengths, bounded padding, equal work; ``"thd"``
is Transformer Engine's partition exactly (checked against a transcription of its kernel), and cutting a
micro-batch by it keeps every token once with its unsplit label."""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.context_parallel import attention_work, document_zigzag, split, thd, thd_slots
from loaders.targets import labels, position_ids
from loaders.varlen import thd_cut


@settings(max_examples=150)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=12), st.integers(1, 8))
def test_zigzag_covers_each_slot_once_with_bounded_padding(seg_lens: list[int], cp: int) -> None:
    parts = [document_zigzag(np.array(seg_lens), cp, r) for r in range(cp)]
    assert len({len(p) for p in parts}) == 1
    flat = np.concatenate(parts)
    assert sorted(flat[flat >= 0].tolist()) == list(range(sum(seg_lens)))
    assert (flat < 0).sum() <= (2 * cp - 1) * len(seg_lens)


@settings(max_examples=100)
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


def te_partitioned_indices(cu_seqlens_padded: list[int], total_tokens: int, world_size: int, rank: int) -> list[int]:
    """An independent transcription, per token, of Transformer Engine's ``thd_get_partitioned_indices``
    (``thd_partition_indices_kernel`` and ``thd_partition_src_index`` in
    transformer_engine/common/fused_attn/context_parallel.cu, NVIDIA/TransformerEngine at commit
    d0067d0da6cb01811b8072a7d304f0e00344ce2b; the kernel needs CUDA, so the loader is checked against this).

    Every boundary of ``cu_seqlens_padded`` is divided by ``world_size``; output slot ``t`` of this rank lies in
    the last sequence whose divided start is ≤ ``t`` (so empty sequences are skipped); at offset ``i`` of that
    sequence's ``n`` divided slots it reads the full tensor at ``i + start·world_size + (n / 2)·c``, with
    ``c = rank`` in the first half and ``c = 2·world_size − 2 − rank`` in the second: chunks ``rank`` and
    ``2·world_size − 1 − rank`` of every sequence.
    """
    assert total_tokens > 0 and total_tokens % (2 * world_size) == 0
    assert all(c % (2 * world_size) == 0 for c in cu_seqlens_padded)  # the kernel asserts it too
    local = [c // world_size for c in cu_seqlens_padded]
    out = []
    for t in range(total_tokens // world_size):
        seq = bisect.bisect_right(local, t) - 1
        n = local[seq + 1] - local[seq]
        i = t - local[seq]
        c = rank if i < n // 2 else 2 * world_size - 2 - rank
        out.append(i + local[seq] * world_size + n // 2 * c)
    return out


def te_padding(seg_lens: list[int], factor: int) -> tuple[list[int], list[int], list[int]]:
    """An independent transcription of Transformer Engine's ``pad_thd_sequences_for_cp`` and
    ``generate_positional_ids_for_cp`` (transformer_engine/pytorch/attention/dot_product_attention/
    context_parallel.py, same commit), applied to the token positions ``0 … Σ seg_lens − 1``: each sequence
    padded at its end to a multiple of ``factor``. Returns the padded sequences' boundaries, each padded slot's
    unpadded position (-1 for padding, TE's ``padding_token_id``) and each slot's position id (0 at each
    sequence's start, on through its padding)."""
    cu, ids, pos, at = [0], [], [], 0
    for ln in seg_lens:
        padded = (ln + factor - 1) // factor * factor
        ids += list(range(at, at + ln)) + [-1] * (padded - ln)
        pos += list(range(padded))
        cu.append(cu[-1] + padded)
        at += ln
    return cu, ids, pos


@settings(max_examples=60)
@given(st.lists(st.integers(0, 70), min_size=1, max_size=8), st.sampled_from([1, 2, 4, 8]))
def test_thd_is_transformer_engines_partition(seg_lens: list[int], cp: int) -> None:
    if cp == 1:  # Megatron-core partitions nothing without CP; the kernel itself would want even lengths
        assert thd(np.array(seg_lens), 1, 0).tolist() == list(range(sum(seg_lens)))
        seg_lens = [2 * ln for ln in seg_lens]
    cu_padded, ids, pos = te_padding(seg_lens, 2 * cp)
    for r in range(cp):
        got = thd_slots(np.array(seg_lens), cp, r)
        assert got.cu_seqlens.tolist() == np.cumsum([0, *seg_lens]).tolist()
        if cp > 1:  # cp 1 is compared on even lengths, which need no padding
            assert got.cu_seqlens_padded.tolist() == cu_padded
        if cu_padded[-1] == 0:
            assert len(got.indices) == 0
            continue
        want = te_partitioned_indices(cu_padded, cu_padded[-1], cp, r)
        assert got.padded.tolist() == want
        assert got.indices.tolist() == [ids[p] for p in want]
        assert got.position_ids.tolist() == [pos[p] for p in want]
        assert np.array_equal(split(np.array(seg_lens), cp, r, "thd"), got.indices)


@settings(max_examples=30)
@given(st.lists(st.integers(1, 90), min_size=1, max_size=10), st.sampled_from([2, 4, 8]), st.integers(0, 2**16))
def test_thd_cut_keeps_every_token_once_with_its_unsplit_label(seg_lens: list[int], cp: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    total = sum(seg_lens)
    cu = torch.tensor(np.cumsum([0, *seg_lens]), dtype=torch.int32)
    ids = torch.from_numpy(rng.integers(0, 500, total))
    whole: dict[str, Any] = {  # a micro-batch as the loader's concat makes it
        "input_ids": ids,
        "labels": labels(ids, cu, total),  # made before any cut, as the loader makes them
        "position_ids": position_ids(cu, total),
        "source_ids": torch.from_numpy(rng.integers(0, 3, total).astype(np.int32)),
        "cu_seqlens": cu,
        "step": 0,
        "sequences": [0],
        "num_tokens": total,
    }
    seen = torch.zeros(total, dtype=torch.int64)
    targets = 0
    for r in range(cp):
        part = thd_cut(whole, cp, r, pad_id=-7)
        n = len(part["indices"])
        assert n * cp == part["cu_seqlens_padded"][-1] and all(len(part[k]) == n for k in ("input_ids", "labels"))
        assert torch.equal(part["cu_seqlens"], cu)
        idx = part["indices"]
        real = idx >= 0
        seen.index_add_(0, idx[real], torch.ones(int(real.sum()), dtype=torch.int64))
        for key in ("input_ids", "labels", "position_ids", "source_ids"):
            assert torch.equal(part[key][real], whole[key][idx[real]]), key
        assert set(part["input_ids"][~real].tolist()) <= {-7} and set(part["labels"][~real].tolist()) <= {-100}
        assert set(part["source_ids"][~real].tolist()) <= {-1}
        targets += int((part["labels"] != -100).sum())
    assert seen.tolist() == [1] * total  # every real token on exactly one rank
    assert targets == int((whole["labels"] != -100).sum())  # the loss's terms, summed over ranks: the unsplit ones
