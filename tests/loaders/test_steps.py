"""``StepLoader``: each optimizer step is exactly this rank's items of the step, stacked or concatenated with
flattened ``cu_seqlens`` and ``max_seqlen`` (and the provenance fields asked for, aligned with them); the
state after every step resumes the rest (also on another world), ``state_at`` agrees with it, and a second
pass is refused. With ``cp_size > 1`` the CP ranks' micro-batches are the whole one cut: every real token on
one rank with its label, and for ``"thd"`` Transformer Engine's slots and ``cu_seqlens_padded``."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from loaders import (
    FIELDS,
    IGNORE_INDEX,
    PROVENANCE_FIELDS,
    ExhaustedError,
    PackedDataset,
    PackedLoader,
    Payload,
    Step,
    StepLoader,
    World,
)
from loaders.context_parallel import cu_seqlens_padded
from loaders.steps import MICRO_BATCH_TOKENS
from tests.loaders.test_context_parallel import te_padding, te_partitioned_indices
from tests.loaders.test_micro_batches import budget_build


def by_step(ds: PackedDataset) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for it in ds:
        out[it["step"]].append({k: v.clone() if torch.is_tensor(v) else v for k, v in it.items()})
    return out


def rows(mb: dict[str, Any], layout: str) -> list[tuple[list[int], list[int], list[int]]]:
    """Per sequence of a micro-batch: its real tokens, labels and positions, cut back out by cu_seqlens."""
    cu = mb["cu_seqlens"].tolist()
    assert mb["max_seqlen"] == max(b - a for a, b in itertools.pairwise(cu))
    flat = {k: mb[k].reshape(-1).tolist() for k in ("input_ids", "labels", "position_ids")}
    assert all(p == b - a - 1 for a, b in itertools.pairwise(cu) for p in [flat["position_ids"][b - 1]])
    if layout == "stacked":
        S = mb["input_ids"].shape[1]
        assert cu[-1] == mb["input_ids"].numel() and all(r * S in cu for r in range(len(mb["sequences"])))
        starts = [r * S for r in range(len(mb["sequences"]))]
    else:
        assert mb["input_ids"].shape == (1, mb["num_tokens"]) and cu[-1] == mb["num_tokens"]
        starts, at = [], 0
        for n in mb["_counts"]:
            starts.append(at)
            at += n
    out = []
    for start, n in zip(starts, mb["_counts"], strict=True):
        out.append(tuple(flat[k][start : start + n] for k in ("input_ids", "labels", "position_ids")))
    return out  # type: ignore[return-value]


@pytest.mark.parametrize(("budget", "layout", "micro_batch"), [(None, None, None), (None, "varlen", 1), (128, None, 2)])
def test_a_step_is_the_ranks_items_of_the_step(
    tiny_build: Path, tmp_path: Path, budget: int | None, layout: str | None, micro_batch: int | None
) -> None:
    build = tiny_build if budget is None else budget_build(tiny_build, tmp_path, budget)  # equal / unequal
    dp = 2 if budget is None else 3
    for rank in range(dp):
        steps = StepLoader(PackedDataset(build, world=World(rank, dp)), layout, micro_batch)
        want = by_step(PackedDataset(build, world=World(rank, dp)))
        expected_layout = layout or ("stacked" if budget is None else "varlen")
        seen = []
        for step in steps:
            assert isinstance(step, Step)
            items = want[step.step]
            seen.append(step.step)
            assert list(step.sequences) == [it["sequence"] for it in items]
            assert step.num_tokens == sum(it["num_tokens"] for it in items)
            labels = torch.cat([it["labels"] for it in items])
            assert step.num_targets == int((labels != IGNORE_INDEX).sum())  # the loss's terms, counted on the host
            k = micro_batch or len(items)
            assert [mb["sequences"] for mb in step.micro_batches] == [
                list(step.sequences[i : i + k]) for i in range(0, len(items), k)
            ]
            got = []
            parts = [items[i : i + k] for i in range(0, len(items), k)]
            for mb, part in zip(step.micro_batches, parts, strict=True):
                assert mb["step"] == step.step and mb["num_targets"] == sum(
                    int((it["labels"] != IGNORE_INDEX).sum()) for it in part
                )
                got += rows({**mb, "_counts": [it["num_tokens"] for it in part]}, expected_layout)
            assert got == [
                tuple(it[f][: it["num_tokens"]].tolist() for f in ("input_ids", "labels", "position_ids"))
                for it in items
            ]
            if expected_layout == "stacked":  # whole rows, padding included
                mb = step.micro_batches[0]
                assert torch.equal(
                    mb["input_ids"], torch.stack([it["input_ids"] for it in items[: len(mb["sequences"])]])
                )
        assert seen == list(range(steps.dataset.planner.steps))


def check_provenance(mb: dict[str, Any], items: list[dict[str, Any]], layout: str) -> None:
    """A micro-batch's provenance: ``source_ids`` laid out as its tokens, ``segments`` one row per segment
    of its ``cu_seqlens``, every segment's slots of that segment's source, all of it the items' own."""
    cu = mb["cu_seqlens"].tolist()
    src = mb["source_ids"]
    assert src.dtype == torch.int32 and src.shape == mb["input_ids"].shape
    assert mb["segments"].shape == (len(cu) - 1, 3)
    flat = src.reshape(-1).tolist()
    assert all(set(flat[a:b]) == {s} for a, b, s in zip(cu, cu[1:], mb["segments"][:, 0].tolist(), strict=False))
    if layout == "stacked":  # whole rows: every segment of every item, the trailing padding's -1 included
        assert torch.equal(src, torch.stack([it["source_ids"] for it in items]))
        keep = [slice(None)] * len(items)
    else:  # real tokens only: each item's documents, its padding segment left out
        assert flat == [s for it in items for s in it["source_ids"][: it["num_tokens"]].tolist()]
        keep = [slice(0, int((it["cu_seqlens"][1:] <= it["num_tokens"]).sum())) for it in items]
        assert -1 not in flat and -1 not in mb["segments"][:, 0].tolist()
    assert mb["segments"].tolist() == [
        row for it, part in zip(items, keep, strict=True) for row in it["segments"][part].tolist()
    ]


@pytest.mark.parametrize(("budget", "layout"), [(None, "stacked"), (None, "varlen"), (128, "varlen")])
def test_micro_batches_carry_the_provenance_asked_for(
    tiny_build: Path, tmp_path: Path, budget: int | None, layout: str
) -> None:
    build = tiny_build if budget is None else budget_build(tiny_build, tmp_path, budget)
    dp = 2 if budget is None else 3
    payload = Payload(fields=FIELDS + PROVENANCE_FIELDS)
    padded = 0
    for rank in range(dp):
        want = by_step(PackedDataset(build, world=World(rank, dp), payload=payload))
        for step in StepLoader(PackedDataset(build, world=World(rank, dp), payload=payload), layout, micro_batch=2):
            items = want[step.step]
            parts = [items[i : i + 2] for i in range(0, len(items), 2)]
            for mb, part in zip(step.micro_batches, parts, strict=True):
                check_provenance(mb, part, layout)
                padded += int((mb["segments"][:, 0] == -1).sum())
    assert (padded > 0) == (layout == "stacked")  # the tiny build has padded sequences
    plain = next(iter(StepLoader(PackedDataset(build, world=World(0, dp)), layout))).micro_batches[0]
    assert not set(plain) & set(PROVENANCE_FIELDS)  # none unless asked


@pytest.mark.parametrize("workers", [0, 2])
def test_state_after_every_step_resumes_the_rest_here_and_on_another_world(tiny_build: Path, workers: int) -> None:
    def make(rank: int = 1, dp: int = 2, state: dict[str, Any] | None = None) -> StepLoader:
        ds = PackedDataset(tiny_build, world=World(rank, dp))
        steps = StepLoader(PackedLoader(ds, num_workers=workers) if workers else ds)
        if state is not None:
            steps.load_state_dict(state)
        return steps

    def key(step: Step) -> tuple[int, list[int], list[list[int]]]:
        return step.step, list(step.sequences), step.micro_batches[0]["input_ids"].tolist()

    first = make()
    whole, states = [], []
    for step in first:
        whole.append(key(step))
        states.append(first.state_dict())
        assert states[-1] == first.state_at(step.step + 1)  # what a trainer reading ahead saves
        assert len(first) == first.facts.steps - step.step - 1
    assert [s for s, *_ in whole] == list(range(first.facts.steps))
    for k in (0, 3, 6):  # resume here: exactly the rest
        assert [key(s) for s in make(state=states[k])] == whole[k + 1 :]

    # elastic: dp 2 → 1 and 2 → 4 at a step boundary: each remaining step's sequences, every one once
    def steps_of(dp: int, state: dict[str, Any] | None = None) -> dict[int, list[int]]:
        out: dict[int, list[int]] = defaultdict(list)
        for r in range(dp):
            for s in make(r, dp, state):
                out[s.step] += s.sequences
        return {t: sorted(v) for t, v in out.items()}

    uninterrupted = steps_of(2)
    for dp in (1, 4):
        assert steps_of(dp, states[2]) == {t: v for t, v in uninterrupted.items() if t > 2}


def test_a_second_pass_is_refused_and_rewind_repeats_the_first(tiny_build: Path) -> None:
    for make in (
        lambda: PackedDataset(tiny_build, world=World(0, 2)),
        lambda: PackedLoader(PackedDataset(tiny_build, world=World(0, 2)), num_workers=2),
        lambda: StepLoader(PackedDataset(tiny_build, world=World(0, 2))),
    ):
        loader: Any = make()
        first = [it["sequence"] if isinstance(it, dict) else it.sequences for it in loader]
        assert first
        with pytest.raises(ExhaustedError, match=r"all 8 steps of this build were already read.*rewind"):
            next(iter(loader))
        loader.rewind()
        assert [it["sequence"] if isinstance(it, dict) else it.sequences for it in loader] == first


def test_what_step_loader_cannot_group_is_refused_up_front(tiny_build: Path) -> None:
    with pytest.raises(ValueError, match="cp_split"):  # CP micro-batches are cut by 'thd' or 'zigzag' only
        StepLoader(PackedDataset(tiny_build, world=World(0, 1, 0, 2), cp_split="contiguous"))
    with pytest.raises(ValueError, match="'stacked' needs whole sequences"):
        StepLoader(PackedDataset(tiny_build, world=World(0, 1, 0, 2)), layout="stacked")
    with pytest.raises(ValueError, match="cu_seqlens"):
        StepLoader(PackedDataset(tiny_build, world=World(0, 1), payload=Payload(fields=("input_ids",))))
    with pytest.raises(ValueError, match="layout"):
        StepLoader(PackedDataset(tiny_build, world=World(0, 1)), layout="padded")
    assert np.array_equal(  # a lean item is enough: input_ids and cu_seqlens
        next(
            iter(
                StepLoader(
                    PackedDataset(tiny_build, world=World(0, 1), payload=Payload(fields=("input_ids", "cu_seqlens")))
                )
            )
        ).micro_batches[0]["input_ids"],
        next(iter(StepLoader(PackedDataset(tiny_build, world=World(0, 1))))).micro_batches[0]["input_ids"],
    )


def check_cut(parts: list[dict[str, Any]], whole: dict[str, Any], how: str, cp: int, pad_id: int) -> None:
    """The CP ranks' ``parts`` of one micro-batch against the cp 1 ``"varlen"`` micro-batch ``whole``."""
    cu = whole["cu_seqlens"]
    padded = cu_seqlens_padded(np.diff(cu.numpy()), cp)
    total = int(whole["num_tokens"])
    seen = torch.zeros(total, dtype=torch.int64)
    targets = 0
    for r, mb in enumerate(parts):
        n = mb["indices"].shape[1]
        assert all(mb[k].shape == (1, n) for k in ("input_ids", "labels", "position_ids", "source_ids"))
        assert torch.equal(mb["cu_seqlens"], cu) and mb["cu_seqlens_padded"].tolist() == padded.tolist()
        assert n * cp == padded[-1] and mb["max_seqlen"] == int(np.diff(padded).max())
        for k in ("segments", "sequences", "num_tokens", "num_targets", "step"):
            assert (mb[k].tolist() if torch.is_tensor(mb[k]) else mb[k]) == (
                whole[k].tolist() if torch.is_tensor(whole[k]) else whole[k]
            ), k
        idx = mb["indices"][0]
        real = idx >= 0
        seen.index_add_(0, idx[real], torch.ones(int(real.sum()), dtype=torch.int64))
        for k in ("input_ids", "labels", "position_ids", "source_ids"):
            assert torch.equal(mb[k][0][real], whole[k][0][idx[real]]), k  # labels: the unsplit document's
        assert set(mb["labels"][0][~real].tolist()) <= {IGNORE_INDEX}
        assert set(mb["source_ids"][0][~real].tolist()) <= {-1}
        targets += int((mb["labels"] != IGNORE_INDEX).sum())
        if how == "thd" and total:  # the slots Transformer Engine partitions for cu_seqlens_padded, and its positions
            slots = te_partitioned_indices(padded.tolist(), int(padded[-1]), cp, r)
            _, ids, pos = te_padding(np.diff(cu.numpy()).tolist(), 2 * cp)
            assert idx.tolist() == [ids[p] for p in slots] and mb["position_ids"][0].tolist() == [pos[p] for p in slots]
            assert set(mb["input_ids"][0][~real].tolist()) <= {pad_id}
    assert seen.tolist() == [1] * total  # every real token on exactly one CP rank
    assert targets == whole["num_targets"]  # the loss summed over the CP ranks has the unsplit loss's terms


@pytest.mark.parametrize(("how", "cp"), [("thd", 2), ("zigzag", 2), ("thd", 4)])
def test_cp_ranks_micro_batches_are_the_whole_one_cut(tiny_build: Path, how: str, cp: int) -> None:
    payload = Payload(fields=FIELDS + PROVENANCE_FIELDS)
    whole = {s.step: s for s in StepLoader(PackedDataset(tiny_build, world=World(0, 1), payload=payload), "varlen", 2)}
    datasets = [PackedDataset(tiny_build, world=World(0, 1, r, cp), cp_split=how, payload=payload) for r in range(cp)]
    items = by_step(PackedDataset(tiny_build, world=World(0, 1, 0, cp), cp_split=how, payload=payload))
    ranks = [list(StepLoader(ds, micro_batch=2)) for ds in datasets]
    assert [s.step for s in ranks[0]] == sorted(whole)
    for parts in zip(*ranks, strict=True):
        want = whole[parts[0].step]
        for p in parts:
            assert (p.sequences, p.num_tokens, p.num_targets) == (want.sequences, want.num_tokens, want.num_targets)
        for k, mb in enumerate(want.micro_batches):
            check_cut([p.micro_batches[k] for p in parts], mb, how, cp, datasets[0].facts.pad_id)
        if how == "zigzag":  # the loader's own cut: each item's slots of its documents, in order
            got = parts[0].micro_batches[0]["input_ids"][0].tolist()
            mine = items[parts[0].step][:2]
            docs = [int((it["cu_seqlens"][1:] <= it["num_tokens"]).sum()) for it in mine]
            keep = [int(it["cu_seqlens_padded"][d]) // cp for it, d in zip(mine, docs, strict=True)]
            assert got == [t for it, n in zip(mine, keep, strict=True) for t in it["input_ids"][:n].tolist()]


@pytest.mark.parametrize(
    ("cp", "budget", "micro_batch", "want"),
    [
        (1, MICRO_BATCH_TOKENS, None, MICRO_BATCH_TOKENS // 64),  # the default: 8192 slots of S = 64
        (1, 128, None, 2),  # two sequences of 64 slots
        (1, 191, None, 2),  # whole sequences only, rounded down
        (1, 10, None, 1),  # never less than one sequence
        (2, 64, None, 2),  # on a CP rank a sequence is S / cp = 32 slots
        (1, 128, 1, 1),  # micro_batch overrides the budget
        (1, None, None, None),  # no budget: the rank's whole step
    ],
)
def test_a_micro_batch_holds_at_most_micro_batch_tokens_slots(
    tiny_build: Path, cp: int, budget: int | None, micro_batch: int | None, want: int | None
) -> None:
    def make(**kw: Any) -> list[Step]:
        return list(StepLoader(PackedDataset(tiny_build, world=World(0, 1, 0, cp)), micro_batch=micro_batch, **kw))

    ds = PackedDataset(tiny_build, world=World(0, 1, 0, cp))
    steps = StepLoader(ds, micro_batch=micro_batch, micro_batch_tokens=budget)
    assert steps.micro_batch == want
    got = make(micro_batch_tokens=budget)
    k = want or 4  # 4 sequences per step on one DP rank
    for step in got:
        assert [mb["sequences"] for mb in step.micro_batches] == [
            list(step.sequences[i : i + k]) for i in range(0, len(step.sequences), k)
        ]
    if budget == MICRO_BATCH_TOKENS:  # what the default gives
        assert [s.sequences for s in make()] == [s.sequences for s in got]
    with pytest.raises(ValueError, match="micro_batch_tokens must be ≥ 1"):
        StepLoader(PackedDataset(tiny_build, world=World(0, 1)), micro_batch_tokens=0)
