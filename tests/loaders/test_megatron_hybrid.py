"""``loaders.megatron_hybrid``: the contract Megatron-core's hybrid CP schedule reads. Per group, every rank has a
list (the same number of groups on every rank), never empty; every document is in exactly one group, on the
ranks of an aligned power-of-two block of its degree (Megatron-core's partner count), listed in the same
order by every rank that shares it; fillers are one per rank and learn nothing. Each sub-sample, cut as
Megatron-core's ``get_batch_on_this_cp_rank`` cuts it on its group, is the hybrid loader's slots of that
document on that rank; the packed (dynamic-CP) form keeps one block per rank and group."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from contract.cost import FLEXSP_7B, CostModel
from loaders import Balance, PackedDataset, World
from loaders.hybrid import HybridWorld, deal
from loaders.hybrid_steps import HybridStepLoader
from loaders.megatron_hybrid import MegatronHybridBatches, megatron_groups, pack_group, sample_id_groups

WORLD = HybridWorld(dp=2, cp=2, capacity=24, gpus_per_node=2)
COST = CostModel()


def check_groups(groups: list[list[list[int]]], degree: np.ndarray, first: np.ndarray, ranks: int) -> None:
    n = len(degree)
    assert all(len(group) == ranks for group in groups)  # the same number of groups on every rank
    placed = np.zeros(n, np.int64)
    for group in groups:
        assert all(ids for ids in group)  # Megatron-core reads at least one sub-sample per rank
        holders: dict[int, list[int]] = {}
        for r, ids in enumerate(group):
            assert len(set(ids)) == len(ids)
            for i in ids:
                holders.setdefault(i, []).append(r)
        for i, rs in holders.items():
            if i >= n:  # a filler: its own rank's, alone
                assert rs == [i - n]
                continue
            placed[i] += 1
            d, f = int(degree[i]), int(first[i])
            assert d & (d - 1) == 0 and f % d == 0  # an aligned power-of-two block
            assert rs == list(range(f, f + d))  # on exactly its block: partner count = degree
        for a in range(ranks):  # shared ids in one order: no rank waits on a partner doing another
            for b in range(a + 1, ranks):
                shared = set(group[a]) & set(group[b])
                assert [i for i in group[a] if i in shared] == [i for i in group[b] if i in shared]
    assert (placed == 1).all()  # every document once


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("one_block", [False, True])
def test_groups_follow_megatrons_contract(seed: int, one_block: bool) -> None:
    rng = np.random.default_rng(seed)
    world = HybridWorld(dp=int(rng.choice([1, 2, 4])), cp=int(rng.choice([1, 2, 4])), capacity=4096, gpus_per_node=8)
    # long-tailed lengths, none longer than the whole world holds (every world here is a power of two)
    lengths = np.minimum(rng.lognormal(6.5, 1.5, int(rng.integers(1, 200))).astype(np.int64) + 1, 4096 * world.size)
    cost = [COST, FLEXSP_7B, CostModel(1.0, 8192.0)][seed % 3]
    d = deal(lengths, world, cost, seed=seed)
    groups = sample_id_groups(d, one_block=one_block)
    check_groups(groups, d.degree, d.first_rank, world.size)
    if not one_block:
        assert len(groups) == d.micro_batches
    else:  # every rank's ids of a group are on one block (fillers alone)
        for group in groups:
            for ids in group:
                real = [i for i in ids if i < len(lengths)]
                assert len({(int(d.degree[i]), int(d.first_rank[i])) for i in real}) <= 1
                assert not real or len(real) == len(ids)
    unfilled = sample_id_groups(d, one_block=one_block, fill=False)
    assert all(i < len(lengths) for group in unfilled for ids in group for i in ids)


def test_megatron_group_sizes() -> None:
    assert megatron_groups(1) == (1,)
    assert megatron_groups(4) == (1, 2, 4)
    assert megatron_groups(8) == (1, 2, 4, 8)
    assert megatron_groups(6) == (1, 2, 6)  # no group of 4: the deal's largest block has none
    assert megatron_groups(12) == (1, 2, 4, 12)


def megatron_cut(t: torch.Tensor, cp: int, r: int) -> torch.Tensor:
    """``_get_batch_on_this_cp_rank_per_sequence_balancing`` of one [1, L] tensor for rank ``r`` of ``cp``."""
    if cp == 1:
        return t
    v = t.view(1, 2 * cp, t.shape[1] // (2 * cp))
    return v.index_select(1, torch.tensor([r, 2 * cp - 1 - r])).reshape(1, -1)


@pytest.fixture(scope="module")
def dataset(tiny_build: Path) -> PackedDataset:
    return PackedDataset(tiny_build, world=World(), balance=Balance(window=1))


def test_sub_samples_cut_by_megatron_are_the_loaders_slots(dataset: PackedDataset) -> None:
    loaders = [HybridStepLoader(dataset, WORLD, r, cost=COST) for r in range(WORLD.size)]
    batches = [MegatronHybridBatches(ld) for ld in loaders]
    for t in range(3):
        pairs = [b.pair(t) for b in batches]
        steps = [ld.get_step(t) for ld in loaders]
        groups = pairs[0][1]
        assert all(p[1] == groups for p in pairs)  # every rank computes the same groups, alone
        d = steps[0].deal
        check_groups(groups, d.degree, d.first_rank, WORLD.size)
        n = len(d.degree)
        for r, (samples, _) in enumerate(pairs):
            assert set(samples) == {i for group in groups for i in group[r]}
            for g, group in enumerate(groups):
                mb = steps[r].micro_batches[g]
                assert [i for i in group[r] if i < n] == mb["documents"].tolist()  # the loader's order
                for i in group[r]:
                    s = samples[i]
                    partners = sum(i in ids for ids in group)
                    assert int(s["local_cp_size"]) == partners
                    L = s["tokens"].shape[1]
                    assert L % (2 * partners if partners > 1 else 1) == 0
                    assert int(s["cu_seqlens_padded"][0, -1]) == int(s["max_seqlen"][0]) == L
                    assert s["loss_mask"].dtype == torch.float32 and (s["labels"] >= 0).all()
                    if i >= n:  # a filler learns nothing
                        assert s["loss_mask"].sum() == 0 and L == 1
                        continue
                    assert int(s["cu_seqlens"][0, -1]) == int(steps[r].lengths[i])
                    assert int(s["loss_mask"].sum()) == int(steps[r].lengths[i]) - 1
                    # Megatron-core cuts it on the block; the loader's slots of document i on this rank
                    local = r - int(d.first_rank[i])
                    k = mb["documents"].tolist().index(i)
                    a, z = int(mb["cu_slots"][k]), int(mb["cu_slots"][k + 1])
                    cut = {key: megatron_cut(s[key], partners, local) for key in ("tokens", "position_ids")}
                    assert torch.equal(cut["tokens"], mb["input_ids"][:, a:z])
                    assert torch.equal(cut["position_ids"], mb["position_ids"][:, a:z])
                    labels = megatron_cut(torch.where(s["loss_mask"] > 0, s["labels"], -100), partners, local)
                    assert torch.equal(labels, mb["labels"][:, a:z])


def test_iterating_moves_the_loaders_position(dataset: PackedDataset) -> None:
    loader = HybridStepLoader(dataset, WORLD, 2, cost=COST)
    batches = MegatronHybridBatches(loader)
    it = iter(batches)
    next(it)
    assert batches.state_dict()["step"] == 1 and len(batches) == loader.steps - 1
    again = MegatronHybridBatches(HybridStepLoader(dataset, WORLD, 2, cost=COST))
    again.load_state_dict(batches.state_dict())
    assert next(iter(again))[1] == next(it)[1]


def test_packed_groups_keep_one_block_per_rank(dataset: PackedDataset) -> None:
    batches = MegatronHybridBatches(HybridStepLoader(dataset, WORLD, 0, cost=COST), one_block=True)
    samples, groups = batches.pair(0)
    for group in groups:
        packed = pack_group(samples, group[0])
        parts = [samples[i] for i in group[0]]
        assert int(packed["local_cp_size"]) == sum(group[0][0] in ids for ids in group)
        assert packed["tokens"].shape == (sum(p["tokens"].shape[1] for p in parts),)
        assert packed["cu_seqlens_padded"][-1] == len(packed["tokens"])
        assert packed["cu_seqlens"].tolist() == [0, *np.cumsum([int(p["cu_seqlens"][0, 1]) for p in parts]).tolist()]
        assert int(packed["max_seqlen"]) == max(p["tokens"].shape[1] for p in parts)
    mixed = MegatronHybridBatches(HybridStepLoader(dataset, WORLD, 3, cost=COST)).pair(0)
    ids = next(ids for ids in mixed[1][0] if len({int(mixed[0][i]["local_cp_size"]) for i in ids}) > 1)
    with pytest.raises(ValueError, match="one local_cp_size"):
        pack_group(mixed[0], ids)
    with pytest.raises(ValueError, match="no sub-samples"):
        pack_group(samples, [])


def test_a_block_megatron_has_no_group_for_is_refused(dataset: PackedDataset) -> None:
    six = HybridWorld(dp=3, cp=2, capacity=20)  # a 64-token piece needs 4 ranks; Megatron-core groups 2 and 6
    batches = MegatronHybridBatches(HybridStepLoader(dataset, six, 0, cost=COST))
    with pytest.raises(ValueError, match=r"over \[4\] ranks"):
        batches.pair(0)
