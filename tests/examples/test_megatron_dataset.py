"""examples/megatron_dataset.py: read through Megatron's sequential sampler (``dataloader_type single``, its
index arithmetic re-stated here), every DP rank gets weir's share of every step, in weir's order, and a resume at
Megatron's ``consumed_samples`` continues with the next step, on any DP size."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch

from loaders import IGNORE_INDEX, PackedDataset, World
from tests.conftest import ROOT


def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("megatron_dataset", ROOT / "examples" / "megatron_dataset.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def megatron_sampler(total: int, consumed: int, mbs: int, rank: int, dp: int) -> Iterator[list[int]]:
    """Megatron-LM's ``MegatronPretrainingSampler`` (megatron/training/datasets/data_samplers.py), drop_last."""
    batch: list[int] = []
    for idx in range(consumed, total):
        batch.append(idx)
        if len(batch) == mbs * dp:
            yield batch[rank * mbs : (rank + 1) * mbs]
            batch = []


@pytest.mark.parametrize(("dp", "mbs"), [(1, 2), (2, 1), (2, 2), (4, 1)])
def test_each_rank_reads_weirs_share_of_each_step_in_weirs_order(tiny_build: Path, dp: int, mbs: int) -> None:
    data = example().MegatronOrder(tiny_build, dp, mbs)
    gb = data.facts.global_batch
    assert len(data) == data.facts.steps * gb
    for rank in range(dp):
        got = [data.sequence(i) for b in megatron_sampler(len(data), 0, mbs, rank, dp) for i in b]
        want = [it["sequence"] for it in PackedDataset(tiny_build, world=World(rank, dp))]
        assert got == want  # the same sequences, steps and order as weir's own loader gives this rank
        consumed = 3 * gb  # Megatron's resume after 3 iterations: the rest, from step 3
        assert [data.sequence(i) for b in megatron_sampler(len(data), consumed, mbs, rank, dp) for i in b] == [
            it["sequence"] for it in PackedDataset(tiny_build, world=World(rank, dp)) if it["step"] >= 3
        ]


def test_items_are_megatron_gpt_batch_fields(tiny_build: Path) -> None:
    data = example().MegatronOrder(tiny_build, 2, 1, attention_mask=True)
    ds = PackedDataset(tiny_build, world=World(0, 1))
    for i in range(0, len(data), 5):
        sample, item = data[i], ds.item(data.sequence(i))
        assert torch.equal(sample["tokens"], item["input_ids"]) and torch.equal(
            sample["position_ids"], item["position_ids"]
        )
        real = item["labels"] != IGNORE_INDEX
        assert torch.equal(sample["loss_mask"], real.float()) and torch.equal(
            sample["labels"][real], item["labels"][real]
        )
        assert int(sample["labels"].max()) < data.facts.vocab_size and int(sample["labels"].min()) >= 0
        mask = sample["attention_mask"][0]  # True = masked: the future, and other documents
        cu = item["cu_seqlens"].tolist()
        for a, b in itertools.pairwise(cu):
            assert not mask[b - 1, a:b].any() and (b >= len(mask) or mask[b:, a:b].all())


def test_what_megatron_cannot_take_is_refused(tiny_build: Path) -> None:
    with pytest.raises(ValueError, match="does not divide"):
        example().MegatronOrder(tiny_build, 2, 3)
