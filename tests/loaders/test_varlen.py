"""``varlen.by_step``: the loader's state after every micro-batch is the next step's start, so a resume from
any of them (also on another world) continues with exactly the rest of the uninterrupted stream; the
provenance fields asked for are concatenated as the tokens and ``cu_seqlens`` are."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from contract.shards import ShardSet
from loaders import Balance, ExhaustedError, PackedDataset, PackedLoader, Payload, World, varlen
from tests.loaders.test_micro_batches import budget_build


def summary(batch: dict[str, Any]) -> tuple[int, list[int], list[int]]:
    return batch["step"], batch["sequences"], batch["input_ids"].tolist()


@pytest.mark.parametrize("workers", [0, 2])
def test_state_after_every_micro_batch_is_a_step_boundary_that_resumes_the_rest(
    tiny_build: Path, tmp_path: Path, workers: int
) -> None:
    build = budget_build(tiny_build, tmp_path, 2 * 64)  # unequal counts: 4 sequences per step over 3 ranks

    def loader(state: dict[str, Any] | None = None, rank: int = 1, size: int = 3) -> PackedLoader | PackedDataset:
        ds = PackedDataset(build, world=World(rank, size), balance=Balance(seed=5))
        out = PackedLoader(ds, num_workers=workers) if workers else ds
        if state is not None:
            out.load_state_dict(state)
        return out

    first = loader()
    whole, states = [], []
    for batch in varlen.by_step(first):
        whole.append(summary(batch))
        states.append(first.state_dict())
    dataset = first.dataset if isinstance(first, PackedLoader) else first
    assert isinstance(dataset, PackedDataset)  # DataLoader's stub types .dataset as any torch Dataset
    steps = dataset.planner.steps
    assert [s for s, *_ in whole] == list(range(steps))
    for k, state in enumerate(states[:-1]):
        assert (state["step"], state["consumed"]) == (whole[k][0] + 1, 0)  # the boundary, not one item past
        assert [summary(b) for b in varlen.by_step(loader(state))] == whole[k + 1 :]
    with pytest.raises(ExhaustedError, match="all 8 steps"):  # the last one: nothing left, said so
        list(varlen.by_step(loader(states[-1])))
    # a step boundary resumes on another world (refused inside a step): dp 3 → 2, every sequence once
    k = 2
    rest = [summary(b) for r in range(2) for b in varlen.by_step(loader(states[k], r, 2))]
    assert min(s for s, *_ in rest) == k + 1
    assert sorted(q for _, seqs, _ in rest for q in seqs) == sorted(
        q
        for r in range(3)
        for it in PackedDataset(build, world=World(r, 3), balance=Balance(seed=5))
        if it["step"] > k
        for q in [it["sequence"]]
    )


def test_by_step_concatenates_the_provenance_as_the_tokens(tiny_build: Path, tmp_path: Path) -> None:
    build = budget_build(tiny_build, tmp_path, 2 * 64)
    shards = ShardSet(build / "shards")
    fields = ("input_ids", "cu_seqlens", "source_ids", "segments")
    for rank in range(3):
        ds = PackedDataset(build, world=World(rank, 3), balance=Balance(seed=5), payload=Payload(fields=fields))
        for batch in varlen.by_step(ds):
            segs = [shards.sequence(q).segments for q in batch["sequences"]]
            whole = [row for s in segs for row in s.tolist()]  # the documents in order, padding dropped
            cu = batch["cu_seqlens"].tolist()
            assert [b - a for a, b in itertools.pairwise(cu)] == [row[3] for row in whole]
            assert batch["segments"].tolist() == [row[:3] for row in whole]
            want = [row[0] for row in whole for _ in range(row[3])]
            assert batch["source_ids"].dtype == torch.int32 and batch["source_ids"].tolist() == want
