"""One item builder, two feeds: items built in chunks from a local build's index equal those built one at a
time from each sequence's verified view read from the shards' own metadata (a streamed build's way), for
any CP size and split and any fields; the provenance fields are the shards' segments, for every slot and
segment the rank's ``indices`` and ``cu_seqlens`` say."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.shards import ShardSet
from loaders import FIELDS, PROVENANCE_FIELDS, Balance, FieldsError, PackedDataset, Payload, World
from loaders.feed import IndexFeed, ViewFeed
from loaders.integrity import VerifiedShardSet
from loaders.items import ItemBuilder
from tests.loaders.segmentations import random_build, segmentations

SPLITS = ("zigzag", "sequence_zigzag", "contiguous")


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def view_builder(ds: PackedDataset) -> ItemBuilder:
    """The builder of ``ds``'s items fed as a streamed build is: verified views of shards opened without the
    node's index (each sequence's segments from its shard's ``meta.npz``)."""
    shards = VerifiedShardSet(ds.shards.dir, None)
    assert shards.index is None
    return ItemBuilder(
        ViewFeed(shards),
        seq_len=ds.facts.seq_len,
        pad_id=ds.facts.pad_id,
        fields=ds.settings.fields,
        world=ds.world,
        cp_split=ds.settings.cp_split,
    )


def check_feeds_agree(build: Path, cp: int, how: str, chunks: list[int], fields=None) -> int:
    """For every CP rank: items built from the index in chunks of the sizes ``chunks`` (cycled) equal those
    built one at a time from the views; returns the number of items compared."""
    compared = 0
    for rank in range(cp):
        ds = PackedDataset(build, world=World(0, 1, rank, cp), cp_split=how, payload=Payload(fields=fields))
        assert isinstance(ds._feed, IndexFeed) and ds.shards.index is not None
        views = view_builder(ds)
        seqs = list(range(len(ds.shards)))
        k = 0
        while seqs:
            size = chunks[k % len(chunks)]
            head, seqs = seqs[:size], seqs[size:]
            for got, i in zip(ds.items(head), head, strict=True):
                assert same(got, views.build([i])[0]), (cp, how, rank, i)
                compared += 1
            k += 1
    return compared


@settings(max_examples=25)
@given(segmentations(), st.lists(st.integers(1, 9), min_size=1, max_size=3), st.integers(0, 9))
def test_both_feeds_give_the_same_items_on_random_segmentations(
    seg: tuple[int, list[list[int]]], chunks: list[int], pad_id: int
) -> None:
    S, seg_lens = seg
    with tempfile.TemporaryDirectory() as tmp:
        build = random_build(Path(tmp), seg_lens, S, pad_id, shard_sequences=3)
        check_feeds_agree(build, 1, "zigzag", chunks)
        for cp in (2, 3, 4):
            for how in SPLITS if S % (2 * cp) == 0 else ("zigzag",):
                check_feeds_agree(build, cp, how, chunks)
        check_feeds_agree(build, 1, "zigzag", chunks, fields=("input_ids", "cu_seqlens"))
        check_feeds_agree(build, 3, "zigzag", chunks, fields=("labels", "indices", "cu_seqlens_padded"))


def check_provenance(build: Path, cp: int, how: str, lean: bool = False) -> None:
    """Every item's provenance fields, on every CP rank, against the shards' own segments: per segment of
    ``cu_seqlens`` (the trailing padding -1) and per slot of the rank (through ``indices``; -1 on padding).
    ``lean``: without labels (``cp`` 1 only), so built from the index's ``cu_seqlens`` as a trainer that
    computes its labels itself gets them."""
    shards = ShardSet(build / "shards")
    S = shards.manifest.seq_len
    fields = ("indices", "cu_seqlens", *PROVENANCE_FIELDS) + (() if lean else ("labels",))
    for rank in range(cp):
        ds = PackedDataset(build, world=World(0, 1, rank, cp), cp_split=how, payload=Payload(fields=fields))
        for i, it in enumerate(ds.items(list(range(len(shards))))):
            segs = shards.sequence(i).segments
            used = int(segs[:, 3].sum())
            tail = [[-1, -1, -1]] if used < S else []
            assert it["source_ids"].dtype == torch.int32 and it["segments"].dtype == torch.int64
            assert it["segments"].shape == (len(it["cu_seqlens"]) - 1, 3) and it["segments"].is_contiguous()
            assert it["segments"].tolist() == segs[:, :3].tolist() + tail, (cp, how, rank, i)
            at = np.repeat(np.append(segs[:, 0], -1), np.append(segs[:, 3], S - used))  # each position's source
            idx = it["indices"].numpy()
            assert it["source_ids"].tolist() == np.where(idx >= 0, at[idx.clip(0)], -1).tolist(), (cp, how, rank, i)


@settings(max_examples=15)
@given(segmentations(), st.lists(st.integers(1, 9), min_size=1, max_size=3))
def test_provenance_is_the_shards_segments_on_random_segmentations(
    seg: tuple[int, list[list[int]]], chunks: list[int]
) -> None:
    S, seg_lens = seg
    with tempfile.TemporaryDirectory() as tmp:
        build = random_build(Path(tmp), seg_lens, S, 0, shard_sequences=3, sources=3)
        for cp in (1, 2, 3, 4):
            for how in SPLITS if S % (2 * cp) == 0 else ("zigzag",):
                check_provenance(build, cp, how)
        check_provenance(build, 1, "zigzag", lean=True)
        check_feeds_agree(build, 1, "zigzag", chunks, fields=("input_ids", "cu_seqlens", *PROVENANCE_FIELDS))
        check_feeds_agree(build, 3, "zigzag", chunks, fields=("labels", "source_ids", "segments"))
        # the lean path with and without the segments' lengths (which only source_ids reads)
        check_feeds_agree(build, 1, "zigzag", chunks, fields=("input_ids", "cu_seqlens", "segments"))
        check_feeds_agree(build, 1, "zigzag", chunks, fields=("input_ids", "source_ids"))


def test_provenance_on_a_real_build_with_split_documents(tiny_build: Path) -> None:
    segs = ShardSet(tiny_build / "shards").segments[1]
    assert (segs[:, 2] > 0).any() and len(set(segs[:, 0].tolist())) == 2  # pieces past a document's start
    for cp, how in ((1, "zigzag"), (2, "zigzag"), (4, "sequence_zigzag")):
        check_provenance(tiny_build, cp, how)
    check_provenance(tiny_build, 1, "zigzag", lean=True)


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_both_feeds_give_the_same_items_on_the_demo_build(demo_build: Path, cp: int) -> None:
    for how in SPLITS:
        if how == "zigzag" or PackedDataset(demo_build, world=World(0, 1)).facts.seq_len % (2 * cp) == 0:
            assert check_feeds_agree(demo_build, cp, how, [32, 5]) > 0


@pytest.mark.parametrize(("S", "n"), [(8192, 12), (70000, 4)])
def test_positions_count_inside_each_segment_past_two_bytes_of_slots(S: int, n: int) -> None:
    """Positions are counted in a narrow type that wraps: a chunk of more than 2^16 slots (12 · 8192) and
    sequences longer than 2^16 (the 4-byte type) still count 0, 1, … inside every segment of cu_seqlens."""
    rng = np.random.default_rng(S)
    seg_lens = []
    for k in range(n):
        cuts = np.sort(rng.choice(np.arange(1, S), 6, replace=False)) if k != 1 else np.array([], np.int64)
        seg_lens.append(np.diff(np.concatenate([[0], cuts])).tolist())  # padding after the last cut; k = 1: all
    with tempfile.TemporaryDirectory() as tmp:
        build = random_build(Path(tmp), seg_lens, S, 3, shard_sequences=5)
        ds = PackedDataset(build, world=World(0, 1))
        for item in ds.items(list(range(n))):
            cu = item["cu_seqlens"].numpy()
            want = np.concatenate([np.arange(d) for d in np.diff(cu)])
            assert np.array_equal(item["position_ids"].numpy(), want)
        assert check_feeds_agree(build, 1, "zigzag", [n]) == n


@pytest.mark.parametrize("cp", [1, 2])
def test_iteration_with_fewer_fields_gives_the_same_arrays(tiny_build: Path, cp: int) -> None:
    lean = ("input_ids", "labels", "cu_seqlens")
    full = list(PackedDataset(tiny_build, world=World(1, 2, cp - 1, cp), balance=Balance(seed=4, window=2)))
    got = list(
        PackedDataset(
            tiny_build, world=World(1, 2, cp - 1, cp), balance=Balance(seed=4, window=2), payload=Payload(fields=lean)
        )
    )
    meta = ("step", "slot", "sequence", "num_tokens")
    assert all(same(g, {k: f[k] for k in (*lean, *meta)}) for g, f in zip(got, full, strict=True))
    assert {k for f in full for k in f} == {*FIELDS, *meta}  # the default: no provenance unless asked
    everything = FIELDS + PROVENANCE_FIELDS
    traced = list(
        PackedDataset(
            tiny_build,
            world=World(1, 2, cp - 1, cp),
            balance=Balance(seed=4, window=2),
            payload=Payload(fields=everything),
        )
    )
    assert all(same({k: t[k] for k in (*FIELDS, *meta)}, f) for t, f in zip(traced, full, strict=True))
    assert {k for t in traced for k in t} == {*everything, *meta}


def test_fields_are_checked_at_the_edge(tiny_build: Path) -> None:
    with pytest.raises(FieldsError, match="'label'"):
        PackedDataset(tiny_build, world=World(0, 1), payload=Payload(fields=("input_ids", "label")))
    with pytest.raises(ValueError, match="not the string"):
        PackedDataset(tiny_build, world=World(0, 1), payload=Payload(fields="input_ids"))
    with pytest.raises(ValueError, match="must include 'labels' when cp_size > 1"):
        PackedDataset(tiny_build, world=World(0, 1, 0, 2), payload=Payload(fields=("input_ids", "cu_seqlens")))
    ds = PackedDataset(tiny_build, world=World(0, 1), payload=Payload(fields=["cu_seqlens", "input_ids", "input_ids"]))
    assert ds.settings.fields == ("input_ids", "cu_seqlens")


def test_whole_sequences_are_the_items_of_a_world_of_one(tiny_build: Path) -> None:
    """ItemBuilder.whole (what the THD cut and the hybrid layout read) gives, on any world, the items a
    one-rank dataset gives, and checks its fields like the dataset does."""
    fields = ("input_ids", "labels", "cu_seqlens", "segments")
    one = PackedDataset(tiny_build, world=World(0, 1), payload=Payload(fields=fields))
    cp2 = PackedDataset(tiny_build, world=World(0, 1, 1, 2), payload=Payload(fields=fields))
    whole = ItemBuilder.whole(cp2.shards, seq_len=cp2.facts.seq_len, pad_id=cp2.facts.pad_id, fields=reversed(fields))
    seqs = list(range(len(one.shards)))
    for a, b in zip(whole.build(seqs), one._builder.build(seqs), strict=True):
        assert same(a, b)
    with pytest.raises(FieldsError, match="'label'"):
        ItemBuilder.whole(cp2.shards, seq_len=cp2.facts.seq_len, pad_id=0, fields=("input_ids", "label"))


def test_a_streamed_builds_chunks_never_span_two_shards(sharded_build: Path) -> None:
    ds = PackedDataset(sharded_build, world=World(0, 2), balance=Balance(window=3))
    first = np.array([sh.first_sequence for sh in ds.shards.manifest.shards])
    mine = list(ds.assignments())
    cut = list(ViewFeed(ds.shards).chunks(mine, 5))
    assert [a for c in cut for a in c] == mine and all(len(c) <= 5 for c in cut)
    shard = lambda c: set(np.searchsorted(first, [s for *_, s in c], side="right").tolist())  # noqa: E731
    assert all(len(shard(c)) == 1 for c in cut)
    assert any(len(shard(c)) > 1 for c in IndexFeed(ds.shards).chunks(mine, 5))  # a local build's do
