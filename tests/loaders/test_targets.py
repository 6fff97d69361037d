"""Labels and positions rebuilt from a lean item equal the loader's own."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from hypothesis import given, settings

from loaders import PackedDataset, Payload, World
from loaders.targets import cp_position_ids, labels, position_ids
from tests.loaders.segmentations import random_build, segmentations


def check_targets(build: Path, cp: int = 1) -> int:
    """Every item of every CP rank: the rebuilt labels/positions equal the item's; returns items checked."""
    checked = 0
    for rank in range(cp):
        for item in PackedDataset(build, world=World(0, 1, rank, cp)):
            cu = item["cu_seqlens"]
            if cp == 1:
                S = len(item["input_ids"])
                assert torch.equal(labels(item["input_ids"], cu, item["num_tokens"]), item["labels"])
                assert torch.equal(position_ids(cu, S), item["position_ids"])
            assert torch.equal(cp_position_ids(item["indices"], cu), item["position_ids"])
            checked += 1
    return checked


def test_targets_equal_the_loaders_on_the_demo_build(demo_build: Path) -> None:
    assert check_targets(demo_build) > 0
    assert check_targets(demo_build, cp=2) > 0


def test_targets_from_a_lean_item(tiny_build: Path) -> None:
    lean = PackedDataset(tiny_build, world=World(0, 1), payload=Payload(fields=("input_ids", "cu_seqlens")))
    padded = 0
    for item, full in zip(lean, PackedDataset(tiny_build, world=World(0, 1)), strict=True):
        assert set(item) == {"input_ids", "cu_seqlens", "step", "slot", "sequence", "num_tokens"}
        got = labels(item["input_ids"], item["cu_seqlens"], item["num_tokens"])
        assert got.dtype == torch.int64 and torch.equal(got, full["labels"])
        assert torch.equal(position_ids(item["cu_seqlens"], len(got)), full["position_ids"])
        padded += item["num_tokens"] < len(got)
    assert padded  # the tiny build has padded sequences


@settings(max_examples=25)
@given(segmentations())
def test_targets_equal_the_loaders_on_random_segmentations(seg: tuple[int, list[list[int]]]) -> None:
    S, seg_lens = seg
    with tempfile.TemporaryDirectory() as tmp:
        build = random_build(Path(tmp), seg_lens, S, pad_id=3, shard_sequences=5)
        assert check_targets(build) == len(seg_lens)
        check_targets(build, cp=3)
