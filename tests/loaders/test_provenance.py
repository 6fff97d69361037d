"""``loaders.provenance`` and the items' ``source_ids``: exact accounting per source.

- ``loss_per_source`` is the plain sum, per source, of the losses at positions with a label and a source;
- every training step of a real build (tiny and demo; cp 1, 2, 4 under every split; dp 1 or 2): the real
  token slots of all ranks' items, counted by ``source_ids``, are the step's tokens per source that the
  build's own segments give (``loaders.stream``), to the token; the targets per source (``loss_per_source``'s
  ``tokens``) are those minus one per document piece; the loss sums of all ranks add up to those of the
  step computed on one rank with whole sequences, exactly;
- the same over real processes: ``torchrun`` (gloo, CPU), two ranks as cp 2 and as dp 2, all-reduced by
  ``reduce_per_source``;
- the provenance fields of items without labels or positions (the loader's lean path, which reads
  ``cu_seqlens`` from the build's index) are those of items with them;
- a trainer that asks for ``segments`` alone gets each slot's source on its own device with ``slot_sources``:
  the ``source_ids`` of every item and every ``StepLoader`` micro-batch, stacked and varlen;
- ``source_ids`` and ``segments`` hold any source index (ids that need 8, 16 or 32 bits), with and
  without the lean path and the build index's ``cu_seqlens``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.shards import ShardSet
from loaders import IGNORE_INDEX, PROVENANCE_FIELDS, Balance, PackedDataset, Payload, StepLoader, World
from loaders.feed import Feed, SegmentTable
from loaders.fields import check_fields
from loaders.items import ItemBuilder
from loaders.provenance import loss_per_source, slot_sources
from loaders.stream import stream_compositions
from tests.loaders.torchrun import run_torchrun

FIELDS = ("input_ids", "labels", "source_ids")


def fake_losses(item: dict[str, Any]) -> torch.Tensor:
    """A per-token "loss" that depends only on the token and its label (so every rank holding a slot computes
    the same value for it), on a 1/8 grid: float64 sums of them are exact in any order."""
    return ((item["input_ids"] * 31 + item["labels"].clamp(min=0) * 7) % 97).to(torch.float32) / 8


def rank_items(build: Path, dp: int, cp: int, how: str, balance: Balance) -> Iterator[dict[str, Any]]:
    for d in range(dp):
        for c in range(cp):
            yield from PackedDataset(
                build, world=World(d, dp, c, cp), cp_split=how, balance=balance, payload=Payload(fields=FIELDS)
            )


def per_step_accounts(
    items: Iterator[dict[str, Any]], steps: int, n_sources: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per training step and source: real token slots (from ``source_ids``), and ``loss_per_source``'s loss
    sums and targets, each summed over ``items``."""
    slots = np.zeros((steps, n_sources), dtype=np.int64)
    losses = np.zeros((steps, n_sources), dtype=np.float64)
    targets = np.zeros((steps, n_sources), dtype=np.int64)
    for it in items:
        src = it["source_ids"]
        assert src.dtype == torch.int32 and src.shape == it["labels"].shape
        t = it["step"]
        slots[t] += torch.bincount(src[src >= 0].long(), minlength=n_sources).numpy()
        loss_sum, tokens = loss_per_source(fake_losses(it), it["labels"], src, n_sources)
        assert loss_sum.dtype == torch.float64 and tokens.dtype == torch.int64 and loss_sum.shape == (n_sources,)
        losses[t] += loss_sum.numpy()
        targets[t] += tokens.numpy()
    return slots, losses, targets


def build_targets(ds: PackedDataset) -> np.ndarray:
    """Targets (labels that are not -100) per training step and source, from the shards' segments alone: each
    document piece's tokens but its last."""
    shards = ds.shards
    offs, segs = shards.segments
    pieces = np.zeros((len(shards), ds.planner.n_sources), dtype=np.int64)
    np.add.at(pieces, (np.repeat(np.arange(len(shards)), np.diff(offs)), segs[:, 0]), 1)
    per_step = np.stack([pieces[ds.planner.step_sequences(t)].sum(axis=0) for t in range(ds.planner.steps)])
    return stream_compositions(ds.planner) - per_step


WORLDS = [(1, 1, "zigzag"), (2, 1, "zigzag"), (2, 2, "zigzag"), (1, 4, "zigzag"), (2, 4, "zigzag")]
WORLDS += [(2, 2, "contiguous"), (1, 4, "sequence_zigzag")]
_reference: dict[tuple[Path, Balance], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


@pytest.mark.parametrize(("dp", "cp", "how"), WORLDS)
@pytest.mark.parametrize(
    ("name", "balance"), [("tiny_build", Balance()), ("tiny_build", Balance(window=2)), ("demo_build", Balance())]
)
def test_every_steps_tokens_per_source_are_the_builds_exactly(
    request: pytest.FixtureRequest, name: str, balance: Balance, dp: int, cp: int, how: str
) -> None:
    build: Path = request.getfixturevalue(name)
    ds = PackedDataset(build, world=World(0, 1), balance=balance)
    n, steps = len(ds.facts.sources), ds.planner.steps
    assert n == ds.planner.n_sources >= 2 and ds.facts.sources == ShardSet(build / "shards").manifest.sources
    want = stream_compositions(ds.planner)  # the build's segments, no token read
    assert want.sum() == ds.facts.tokens
    slots, losses, targets = per_step_accounts(rank_items(build, dp, cp, how, balance), steps, n)
    assert np.array_equal(slots, want)  # every step, every source: 0 tokens off
    assert np.array_equal(targets, build_targets(ds))
    key = (build, balance)
    if key not in _reference:  # one rank, whole sequences: the loss sums every world must add up to
        _reference[key] = per_step_accounts(rank_items(build, 1, 1, "zigzag", balance), steps, n)
    assert np.array_equal(losses, _reference[key][1])


@settings(max_examples=60)
@given(
    st.lists(st.tuples(st.integers(-1, 3), st.integers(0, 400), st.booleans()), min_size=0, max_size=40),
    st.integers(4, 6),
    st.booleans(),
)
def test_loss_per_source_sums_the_kept_positions(rows: list[tuple[int, int, bool]], n: int, two_d: bool) -> None:
    src = torch.tensor([s for s, _, _ in rows], dtype=torch.int32)
    loss = torch.tensor([v / 8 for _, v, _ in rows], dtype=torch.float32)
    labels = torch.tensor([IGNORE_INDEX if ignored else 5 for *_, ignored in rows], dtype=torch.int64)
    loss[labels == IGNORE_INDEX] = float("nan")  # what is not a target counts nowhere, whatever its value
    if two_d and len(rows) % 2 == 0:
        src, loss, labels = (x.view(2, -1) for x in (src, loss, labels))
    got_sum, got_tokens = loss_per_source(loss, labels, src, n)
    want_sum, want_tokens = [0.0] * n, [0] * n
    for s, v, ignored in rows:
        if s >= 0 and not ignored:
            want_sum[s] += v / 8
            want_tokens[s] += 1
    assert got_sum.dtype == torch.float64 and got_tokens.dtype == torch.int64
    assert got_sum.tolist() == want_sum and got_tokens.tolist() == want_tokens


def test_loss_per_source_refuses_shapes_that_differ() -> None:
    with pytest.raises(ValueError, match="one shape"):
        loss_per_source(torch.zeros(2, 4), torch.zeros(8, dtype=torch.int64), torch.zeros(2, 4, dtype=torch.int32), 2)


def test_torchrun_ranks_all_reduced_equal_one_rank(tiny_build: Path, tmp_path: Path) -> None:
    run_torchrun("torchrun_provenance.py", 2, tiny_build, tmp_path)


@pytest.mark.parametrize("name", ["tiny_build", "demo_build"])
def test_items_without_labels_carry_the_same_provenance(request: pytest.FixtureRequest, name: str) -> None:
    build: Path = request.getfixturevalue(name)
    lean = ("input_ids", "cu_seqlens", *PROVENANCE_FIELDS)  # cp 1 only: with cp > 1 labels must be asked for
    pair = [PackedDataset(build, world=World(0, 1), payload=Payload(fields=f)) for f in (lean, ("labels", *lean))]
    for a, b in zip(*pair, strict=True):
        assert a.keys() == b.keys() - {"labels"}
        assert all(torch.equal(a[k], b[k]) for k in ("input_ids", "cu_seqlens", *PROVENANCE_FIELDS))


@pytest.mark.parametrize("layout", ["stacked", "varlen"])
def test_segments_expand_to_source_ids_on_the_trainers_device(tiny_build: Path, layout: str) -> None:
    fields = ("input_ids", "labels", "cu_seqlens", "source_ids", "segments")
    ds = PackedDataset(tiny_build, world=World(1, 2), payload=Payload(fields=fields))
    for step in StepLoader(ds, layout=layout):
        for mb in step.micro_batches:
            expanded = slot_sources(mb["segments"], mb["cu_seqlens"], mb["input_ids"].numel())
            assert torch.equal(expanded, mb["source_ids"].reshape(-1).long())
    for it in PackedDataset(tiny_build, world=World(1, 2), payload=Payload(fields=fields)):  # and each item
        assert torch.equal(
            slot_sources(it["segments"], it["cu_seqlens"], len(it["input_ids"])), it["source_ids"].long()
        )


def test_slot_sources_refuses_what_is_not_one_batchs_segments_and_cu_seqlens() -> None:
    segments = torch.tensor([[2, 7, 0], [-1, -1, -1]])
    assert slot_sources(segments, torch.tensor([0, 3, 5], dtype=torch.int32), 5).tolist() == [2, 2, 2, -1, -1]
    for segs, cu in ((segments[:, 0], torch.tensor([0, 3, 5])), (segments, torch.tensor([0, 5]))):
        with pytest.raises(ValueError, match=r"must be \[k, 3\] and \[k \+ 1\]"):
            slot_sources(segs, cu, 5)


class OneTable:
    """A feed (what ``ItemBuilder`` reads) of two hand-made sequences of S = 16 whose source ids need 8, 16
    and 32 bits: tokens 0…15 in each row; the first row ends in padding."""

    S = 16
    SEGMENTS = np.array([[200, 1, 0, 5], [40000, 2, 3, 7], [5, 9, 0, 16]], dtype=np.int64)

    def __init__(self, sources: list[int], with_cu: bool) -> None:
        segs = self.SEGMENTS.copy()
        segs[:, 0] = sources
        cu = (np.array([0, 5, 12, 16, 0, 16], dtype=np.int32), np.array([0, 4, 6])) if with_cu else None
        offsets, used = np.array([0, 2, 3]), np.array([12, 16])
        self.table = SegmentTable(offsets, segs[:, 3], used, np.zeros(2, np.int64), segs, cu)

    def read(self, idx: np.ndarray, block: np.ndarray) -> tuple[SegmentTable, np.ndarray]:
        block[:] = np.arange(self.S)
        return self.table, idx


@pytest.mark.parametrize("sources", [[3, 4, 5], [200, 4, 5], [200, 40000, 5]])
@pytest.mark.parametrize("with_cu", [True, False])
@pytest.mark.parametrize("labels", [True, False])
def test_source_ids_of_any_source_index(sources: list[int], with_cu: bool, labels: bool) -> None:
    fields = check_fields(("input_ids", "cu_seqlens", *(("labels",) if labels else ()), *PROVENANCE_FIELDS), 1)
    feed = cast(Feed, OneTable(sources, with_cu))  # a stand-in: ItemBuilder calls only its read()
    builder = ItemBuilder(feed, seq_len=16, pad_id=0, fields=fields, world=World(), cp_split="zigzag")
    a, b = builder.build([0, 1])
    s0, s1, s2 = sources
    assert a["source_ids"].tolist() == [s0] * 5 + [s1] * 7 + [-1] * 4 and b["source_ids"].tolist() == [s2] * 16
    assert a["source_ids"].dtype == torch.int32 and a["segments"].dtype == torch.int64
    assert a["segments"].tolist() == [[s0, 1, 0], [s1, 2, 3], [-1, -1, -1]] and b["segments"].tolist() == [[s2, 9, 0]]
    assert a["cu_seqlens"].tolist() == [0, 5, 12, 16] and b["cu_seqlens"].tolist() == [0, 16]
