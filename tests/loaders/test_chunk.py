"""Chunked items (any CP size and split, any fields) equal the one-at-a-time ``PackedDataset.item``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loaders import FIELDS, FieldsError, PackedDataset
from tests.loaders.segmentations import random_build, segmentations

SPLITS = ("zigzag", "sequence_zigzag", "contiguous")


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def check_chunks_equal_items(build: Path, cp: int, how: str, chunks: list[int], fields=None) -> int:
    """For every CP rank: items built in chunks of the sizes ``chunks`` (cycled) equal ``item(i)``; returns
    the number of items compared."""
    compared = 0
    for rank in range(cp):
        ds = PackedDataset(build, 0, 1, rank, cp, cp_split=how, fields=fields)
        seqs = list(range(len(ds.shards)))
        k = 0
        while seqs:
            size = chunks[k % len(chunks)]
            head, seqs = seqs[:size], seqs[size:]
            for got, i in zip(ds.items(head), head, strict=True):
                assert same(got, ds.item(i)), (cp, how, rank, i)
                compared += 1
            k += 1
    return compared


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segmentations(), st.lists(st.integers(1, 9), min_size=1, max_size=3), st.integers(0, 9))
def test_chunks_equal_items_on_random_segmentations(
    seg: tuple[int, list[list[int]]], chunks: list[int], pad_id: int
) -> None:
    S, seg_lens = seg
    with tempfile.TemporaryDirectory() as tmp:
        build = random_build(Path(tmp), seg_lens, S, pad_id, shard_sequences=3)
        check_chunks_equal_items(build, 1, "zigzag", chunks)
        for cp in (2, 3, 4):
            for how in SPLITS if S % (2 * cp) == 0 else ("zigzag",):
                check_chunks_equal_items(build, cp, how, chunks)
        check_chunks_equal_items(build, 1, "zigzag", chunks, fields=("input_ids", "cu_seqlens"))
        check_chunks_equal_items(build, 3, "zigzag", chunks, fields=("labels", "indices", "cu_seqlens_padded"))


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_chunks_equal_items_on_the_demo_build(demo_build: Path, cp: int) -> None:
    for how in SPLITS:
        if how == "zigzag" or PackedDataset(demo_build, 0, 1).seq_len % (2 * cp) == 0:
            assert check_chunks_equal_items(demo_build, cp, how, [32, 5]) > 0


@pytest.mark.parametrize("cp", [1, 2])
def test_iteration_with_fewer_fields_gives_the_same_arrays(tiny_build: Path, cp: int) -> None:
    lean = ("input_ids", "labels", "cu_seqlens")
    full = list(PackedDataset(tiny_build, 1, 2, cp - 1, cp, seed=4, window=2))
    got = list(PackedDataset(tiny_build, 1, 2, cp - 1, cp, seed=4, window=2, fields=lean))
    meta = ("step", "slot", "sequence", "num_tokens")
    assert all(same(g, {k: f[k] for k in (*lean, *meta)}) for g, f in zip(got, full, strict=True))
    assert {k for f in full for k in f} == {*FIELDS, *meta}


def test_fields_are_checked_at_the_edge(tiny_build: Path) -> None:
    with pytest.raises(FieldsError, match="'label'"):
        PackedDataset(tiny_build, 0, 1, fields=("input_ids", "label"))
    with pytest.raises(ValueError, match="not the string"):
        PackedDataset(tiny_build, 0, 1, fields="input_ids")
    with pytest.raises(ValueError, match="must include 'labels' when cp_size > 1"):
        PackedDataset(tiny_build, 0, 1, 0, 2, fields=("input_ids", "cu_seqlens"))
    ds = PackedDataset(tiny_build, 0, 1, fields=["cu_seqlens", "input_ids", "input_ids"])
    assert ds.fields == ("input_ids", "cu_seqlens")
