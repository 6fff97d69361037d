"""``HybridStepLoader``: every step is the build's step (its documents, each token once over the ranks with
its unsplit label), each split document cut by Transformer Engine's THD partition inside its aligned block
(checked against a transcription of Transformer Engine), the ranks of a block meeting their documents in the
same micro-batch and order, every rank running the same number of micro-batches, the targets counted for an
exact loss; a state after any step resumes on the same or another world (the deal recomputed), and malformed
or foreign states are refused. Under torchrun (gloo, 4 processes) the layout trains a tiny transformer to the
loss and gradients of one process computing the same documents."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from contract.cost import CostModel
from loaders import Balance, ExhaustedError, PackedDataset, StateError, StepLoader, World
from loaders.hybrid import HybridWorld
from loaders.hybrid_steps import HybridStep, HybridStepLoader, step_seed
from tests.loaders.test_context_parallel import te_padding, te_partitioned_indices
from tests.loaders.torchrun import run_torchrun

# pieces of 64 tokens on 4 ranks, of 25 on 2, shorter documents whole; attention alone prices the compute, and
# the default communication terms make splitting any further never pay
WORLD = HybridWorld(dp=2, cp=2, capacity=24, gpus_per_node=2)
COST = CostModel()


@pytest.fixture(scope="module")
def dataset(tiny_build: Path) -> PackedDataset:
    """The tiny build opened once (each rank's loader shares it)."""
    return PackedDataset(tiny_build, world=World(), balance=Balance(window=1))


def ranks_of(ds: PackedDataset, world: HybridWorld = WORLD, **kw: object) -> list[HybridStepLoader]:
    return [HybridStepLoader(ds, world, r, cost=COST, **kw) for r in range(world.size)]  # type: ignore[arg-type]


def check_step(steps: list[HybridStep], loader: HybridStepLoader) -> None:
    """Every promise of one step, from all ranks' views of it."""
    t = steps[0].step
    docs = loader.documents(t)
    d = steps[0].deal
    ids, labels = docs.input_ids.numpy(), docs.labels.numpy()
    assert all(s.step == t and s.deal.micro_batches == d.micro_batches for s in steps)
    assert all(len(s.micro_batches) == d.micro_batches for s in steps)  # the same number on every rank
    assert steps[0].num_targets == int((labels != -100).sum()) == sum(s.rank_targets for s in steps)
    assert steps[0].num_tokens == len(ids) == sum(s.rank_tokens for s in steps)
    seen = np.zeros(len(ids), np.int64)
    by_block: dict[tuple[int, tuple[int, ...]], list] = {}
    for s in steps:
        for m, mb in enumerate(s.micro_batches):
            n = mb["input_ids"].shape[1]
            for key in ("input_ids", "labels", "position_ids", "indices", "source_ids"):
                assert mb[key].shape == (1, n), key
            held = mb["documents"].numpy()
            assert (d.micro_batch[held] == m).all()
            assert mb["num_targets"] == int((mb["labels"] != -100).sum())
            assert len(mb["cu_seqlens"]) == len(held) + 1 == len(mb["cu_slots"])
            assert int(mb["cu_slots"][-1]) == n
            cu, idx = mb["cu_seqlens"].numpy().astype(np.int64), mb["indices"][0].numpy()
            real = idx >= 0
            doc = np.searchsorted(cu[1:], idx[real], side="right")
            pos = docs.cu[held[doc]] + idx[real] - cu[doc]  # each real slot's token among the step's
            np.add.at(seen, pos, 1)
            assert np.array_equal(mb["input_ids"][0].numpy()[real], ids[pos])
            assert np.array_equal(mb["labels"][0].numpy()[real], labels[pos])  # the unsplit document's labels
            padding = mb["input_ids"][0].numpy()[~real]
            assert (mb["labels"][0].numpy()[~real] == -100).all() and (padding == loader.pad_id).all()
            assert np.array_equal(mb["segments"].numpy(), docs.segments.numpy()[held])
            for b in mb["blocks"]:
                a, z = b.documents
                assert (d.degree[held[a:z]] == b.local_cp_size).all()
                assert (d.first_rank[held[a:z]] == b.ranks[0]).all() and b.ranks[0] % b.local_cp_size == 0
                assert b.ranks[b.local_cp_rank] == s.rank
                # Transformer Engine's THD partition of the block's documents, padded at their ends
                lens = [int(x) for x in docs.lengths[held[a:z]]]
                pcu, where, position = te_padding(lens, 2 * b.local_cp_size if b.local_cp_size > 1 else 1)
                assert b.cu_seqlens_padded.tolist() == pcu
                if b.local_cp_size > 1:
                    take = te_partitioned_indices(pcu, pcu[-1], b.local_cp_size, b.local_cp_rank)
                else:
                    take = list(range(pcu[-1]))
                sa, sz = b.slots
                base = int(cu[a])  # the block's documents' first position in the micro-batch's coordinates
                want_idx = [where[i] + base if where[i] >= 0 else -1 for i in take]
                assert idx[sa:sz].tolist() == want_idx
                assert mb["position_ids"][0, sa:sz].tolist() == [position[i] for i in take]
                by_block.setdefault((m, b.ranks), []).append((held[a:z].tolist(), b.cu_seqlens.tolist(), sz - sa))
    assert (seen == 1).all()  # every token of the step on exactly one rank
    for (_, ranks), views in by_block.items():
        assert len(views) == len(ranks)  # every rank of the block has the block in that micro-batch
        assert all(v[:2] == views[0][:2] for v in views)  # the same documents, in the same order
        assert len({v[2] for v in views}) == 1  # the same number of slots on each


def test_every_step_is_the_builds_step_cut_by_thd_inside_blocks(dataset: PackedDataset) -> None:
    loaders = ranks_of(dataset)
    degrees: set[int] = set()
    for t in range(loaders[0].steps):
        steps = [ld.get_step(t) for ld in loaders]
        check_step(steps, loaders[0])
        degrees |= set(steps[0].deal.degree.tolist())
        # the step's documents are the build's segments of that step, in order
        first = dataset.planner.first
        offs, segs = dataset.shards.segments
        want = segs[offs[first[t]] : offs[first[t + 1]]]
        docs = loaders[0].documents(t)
        assert np.array_equal(loaders[0].lengths(t), docs.lengths)
        assert np.array_equal(docs.lengths, want[:, 3]) and np.array_equal(docs.segments.numpy(), want[:, :3])
    assert degrees == {1, 2, 4}


def test_deal_is_the_same_on_every_rank_and_follows_the_seed(dataset: PackedDataset) -> None:
    a, b = HybridStepLoader(dataset, WORLD, 0), HybridStepLoader(dataset, WORLD, 3)
    assert a.seed == dataset.facts.seed and a.cost == dataset.facts.cost  # the build's, by default
    for t in range(3):
        da, db = a.deal_of(t), b.deal_of(t)
        assert all(np.array_equal(getattr(da, k), getattr(db, k)) for k in ("degree", "first_rank", "micro_batch"))
    assert step_seed(7, 1) != step_seed(7, 2) and step_seed(7, 1) != step_seed(8, 1)
    other = HybridStepLoader(dataset, WORLD, 0, seed=123)
    assert other.seed == 123 and other.get_step(0).deal.micro_batches >= 1


def test_resume_after_any_step_on_the_same_or_another_world(dataset: PackedDataset) -> None:
    loader = HybridStepLoader(dataset, WORLD, 1, cost=COST)
    it = iter(loader)
    first = [next(it) for _ in range(3)]
    state = loader.state_dict()
    assert state == loader.state_at(3) and state["step"] == 3 and len(loader) == loader.steps - 3
    rest = list(it)
    again = HybridStepLoader(dataset, WORLD, 1, cost=COST)
    again.load_state_dict(state)
    resumed = list(again)
    assert [s.step for s in first + resumed] == list(range(loader.steps))
    for x, y in zip(rest, resumed, strict=True):  # bit for bit
        for ma, mb in zip(x.micro_batches, y.micro_batches, strict=True):
            assert torch.equal(ma["input_ids"], mb["input_ids"]) and torch.equal(ma["labels"], mb["labels"])
    # elastic: another dp × cp world and capacity resumes the same steps, dealt afresh
    wide = HybridWorld(dp=4, cp=2, capacity=32, gpus_per_node=8)
    others = ranks_of(dataset, wide)
    for ld in others:
        ld.load_state_dict(state)
    steps = [list(ld) for ld in others]
    assert [s.step for s in steps[0]] == list(range(3, loader.steps))
    for k in range(len(steps[0])):
        check_step([s[k] for s in steps], others[0])
    with pytest.raises(ExhaustedError):
        iter(again)
    again.rewind()
    assert next(iter(again)).step == 0


def test_a_fixed_layout_state_at_a_step_boundary_resumes_here(dataset: PackedDataset) -> None:
    fixed = StepLoader(dataset, micro_batch=1)
    loader = HybridStepLoader(dataset, WORLD, 2)
    loader.load_state_dict(fixed.state_at(4))
    assert next(iter(loader)).step == 4
    inside = dataset.state_at(2, 0)  # one sequence of step 2 delivered
    with pytest.raises(StateError, match="inside step 2"):
        loader.load_state_dict(inside)
    regrouped = {**fixed.state_at(4), "window": 2}
    with pytest.raises(StateError, match="window 2"):
        loader.load_state_dict(regrouped)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"build_id": "0" * 64}, "another build"),
        ({"seed": 8}, "seed 8"),
        ({"step": 99}, "has 8 steps"),
        ({"step": -1}, "'step' is -1"),
        ({"step": "3"}, "'step' is '3'"),
        ({"seed": True}, "'seed' is True"),
        ({"version": 2}, "version 2"),
        ({"extra": 1}, "fields"),
    ],
)
def test_malformed_or_foreign_states_are_refused(dataset: PackedDataset, change: dict, match: str) -> None:
    loader = HybridStepLoader(dataset, WORLD, 0)
    with pytest.raises(StateError, match=match):
        loader.load_state_dict({**loader.state_at(1), **change})
    with pytest.raises(StateError, match="a list"):
        loader.load_state_dict([])  # type: ignore[arg-type]
    assert loader.state_dict()["step"] == 0  # nothing moved


def test_bad_rank_capacity_or_step_is_refused(dataset: PackedDataset) -> None:
    with pytest.raises(ValueError, match="rank 4 is outside"):
        HybridStepLoader(dataset, WORLD, 4)
    with pytest.raises(ValueError, match="raise capacity to ≥ 16"):
        HybridStepLoader(dataset, HybridWorld(dp=2, cp=2, capacity=15), 0)
    with pytest.raises(ValueError, match="outside this build's steps"):
        HybridStepLoader(dataset, WORLD, 0).get_step(8)


def test_a_path_opens_the_builds_own_steps(tiny_build: Path, dataset: PackedDataset) -> None:
    by_path, by_ds = HybridStepLoader(tiny_build, WORLD, 0), HybridStepLoader(dataset, WORLD, 0)
    assert by_path.build_id == by_ds.build_id and by_path.steps == by_ds.steps == 8
    assert torch.equal(by_path.documents(5).input_ids, by_ds.documents(5).input_ids)


def test_torchrun_hybrid_layout_trains_like_one_process(tiny_build: Path, tmp_path: Path) -> None:
    run_torchrun("torchrun_hybrid.py", 4, tiny_build, tmp_path)
    print((tmp_path / "verdict.txt.diff").read_text())  # the largest loss and gradient differences (pytest -s)
