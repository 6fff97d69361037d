"""PackedDataset: what it yields, how ranks split it, and exact resume."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch

from loaders import IGNORE_INDEX, PackedDataset
from mixing.shards import ShardSet


def items(ds: PackedDataset, n: int | None = None) -> list[dict]:
    """The first ``n`` items (all when None), pulling no item beyond them."""
    return list(itertools.islice(ds, n))


def same(a: dict, b: dict) -> bool:
    return all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    ) and a.keys() == b.keys()


def test_items_have_consistent_boundaries_labels_and_positions(demo_build: Path) -> None:
    ds = PackedDataset(demo_build)
    shards = ShardSet(demo_build / "shards")
    steps = []
    for item in items(ds, 64):
        x, y, pos, cu = item["input_ids"], item["labels"], item["position_ids"], item["cu_seqlens"]
        S = ds.seq_len
        assert x.shape == y.shape == pos.shape == (S,) and x.dtype == torch.int64
        assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == S and bool((cu[1:] > cu[:-1]).all())
        real = int(shards.sequence(item["sequence"]).segments[:, 3].sum())
        for a, b in zip(cu[:-1].tolist(), cu[1:].tolist(), strict=True):
            assert torch.equal(pos[a:b], torch.arange(b - a))  # positions restart at each document
            if b <= real:
                assert torch.equal(y[a : b - 1], x[a + 1 : b])  # next token inside the document
            assert y[b - 1] == IGNORE_INDEX  # never across a boundary
        assert bool((y[real:] == IGNORE_INDEX).all())
        steps.append(item["step"])
    assert steps == sorted(steps)


def test_dp_ranks_partition_every_step(demo_build: Path) -> None:
    full = ShardSet(demo_build / "shards")
    seen: list[int] = []
    for r in range(4):
        ds = PackedDataset(demo_build, dp_rank=r, dp_size=4, seed=3)
        got = items(ds)
        assert len(got) == len(full) // 4
        per_step = np.bincount([g["step"] for g in got])
        assert set(per_step.tolist()) == {full.manifest["global_batch"] // 4}
        seen += [g["sequence"] for g in got]
    assert sorted(seen) == list(range(len(full)))


def test_cp_slices_reassemble_the_sequence(demo_build: Path) -> None:
    whole = items(PackedDataset(demo_build), 5)
    parts = [items(PackedDataset(demo_build, cp_rank=c, cp_size=4), 5) for c in range(4)]
    for i, w in enumerate(whole):
        for key in ("input_ids", "labels", "position_ids"):
            assert torch.equal(torch.cat([p[i][key] for p in parts]), w[key])
        assert all(torch.equal(p[i]["cu_seqlens"], w["cu_seqlens"]) for p in parts)


@pytest.mark.parametrize("stop", [0, 1, 7, 23])
def test_resume_gives_exactly_the_uninterrupted_stream(demo_build: Path, stop: int) -> None:
    reference = items(PackedDataset(demo_build, dp_rank=1, dp_size=2, seed=11))
    first = PackedDataset(demo_build, dp_rank=1, dp_size=2, seed=11)
    head = items(first, stop)
    state = first.state_dict()
    resumed = PackedDataset(demo_build, dp_rank=1, dp_size=2, seed=11)
    resumed.load_state_dict(state)
    tail = items(resumed)
    assert len(head) + len(tail) == len(reference)
    assert all(same(a, b) for a, b in zip(head + tail, reference, strict=True))


def test_refuses_state_from_another_world_or_build(demo_build: Path, tiny_mix_path: Path) -> None:
    state = PackedDataset(demo_build, dp_rank=0, dp_size=2).state_dict()
    with pytest.raises(ValueError, match="saved for"):
        PackedDataset(demo_build, dp_rank=0, dp_size=4).load_state_dict(state)
    with pytest.raises(ValueError, match="another build"):
        PackedDataset(demo_build).load_state_dict({**state, "build_id": "0" * 64})


def test_dataloader_workers_split_without_duplicates(demo_build: Path) -> None:
    ds = PackedDataset(demo_build, dp_rank=0, dp_size=2)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = sorted(item["sequence"] for item in loader)
    assert got == sorted(ds.rank_sequences().tolist())
