"""``loaders/hybrid_batch.py``: one rank's micro-batch cut from a step's documents by a deal. Over the ranks of
a micro-batch every real token of every document is delivered exactly once, with the label and THD position it
has in the unsplit document; a split document is cut by Transformer Engine's THD partition inside its block, the
same padded lengths on every rank of it; padding slots are inert. (The loader over real builds, its resume and
the torchrun reference: ``test_hybrid_steps.py``.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loaders.context_parallel import thd_slots
from loaders.fields import IGNORE_INDEX
from loaders.hybrid import Deal
from loaders.hybrid_batch import StepDocuments, micro_batch

PAD = 0


def step_of(lengths: list[int]) -> StepDocuments:
    """A step of documents of ``lengths`` tokens: token ids count up from 1 (never the pad id), one source
    per document."""
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    T = int(cu[-1])
    ids = torch.arange(1, T + 1, dtype=torch.int64)
    labels = torch.cat([ids[1:], torch.tensor([IGNORE_INDEX])])
    labels[torch.from_numpy(cu[1:] - 1)] = IGNORE_INDEX  # a document's last token predicts nothing
    source = torch.from_numpy(np.repeat(np.arange(len(lengths)), lengths).astype(np.int32))
    n = len(lengths)
    return StepDocuments(
        step=3,
        sequences=np.arange(1, dtype=np.int64),
        cu=cu,
        input_ids=ids,
        labels=labels,
        source_ids=source,
        segments=torch.stack([torch.arange(n), torch.arange(100, 100 + n), torch.zeros(n, dtype=torch.int64)], 1),
    )


# four ranks, two micro-batches: documents whole (degree 1), over blocks of 2 and over all 4
LENGTHS = [5, 12, 7, 30, 3, 9]
DEAL = Deal(
    degree=np.array([1, 2, 1, 4, 1, 2]),
    first_rank=np.array([0, 0, 1, 0, 3, 2]),
    micro_batch=np.array([0, 0, 0, 1, 1, 1]),
    rank_time=np.ones(4),
    micro_batches=2,
)


@pytest.mark.parametrize("m", [0, 1])
def test_every_token_once_with_its_unsplit_label_and_position(m: int) -> None:
    docs = step_of(LENGTHS)
    seen: dict[int, tuple[int, int]] = {}  # token id → (label, position)
    for rank in range(4):
        held = DEAL.rank_documents(rank)[m]
        mb = micro_batch(docs, DEAL, rank, m, held, PAD)
        ids, labels, pos = (mb[k][0] for k in ("input_ids", "labels", "position_ids"))
        real = ids != PAD
        assert mb["num_tokens"] == int(real.sum()) and mb["num_targets"] == int((labels != IGNORE_INDEX).sum())
        assert (labels[~real] == IGNORE_INDEX).all() and (mb["source_ids"][0][~real] == -1).all()
        assert (mb["indices"][0][~real] == -1).all()
        for t, lab, p in zip(ids[real].tolist(), labels[real].tolist(), pos[real].tolist(), strict=True):
            assert t not in seen, f"token {t} delivered twice"
            seen[t] = (lab, p)
        # blocks largest first, each the rank's aligned block of its degree
        sizes = [b.local_cp_size for b in mb["blocks"]]
        assert sizes == sorted(sizes, reverse=True)
        for b in mb["blocks"]:
            assert b.ranks[0] % b.local_cp_size == 0 and rank in b.ranks and b.ranks[b.local_cp_rank] == rank
    want = [j for j in range(len(LENGTHS)) if DEAL.micro_batch[j] == m]
    for j in want:
        start = int(docs.cu[j])
        for k in range(LENGTHS[j]):
            label, position = seen.pop(start + k + 1)
            assert position == k
            assert label == (start + k + 2 if k < LENGTHS[j] - 1 else IGNORE_INDEX)
    assert not seen, "a token of another micro-batch's document"


def test_a_split_document_is_the_thd_partition_of_its_block() -> None:
    docs = step_of(LENGTHS)
    j = 3  # 30 tokens over ranks 0..3: padded to 32, rank r holds chunks r and 7 − r of 4 tokens
    for rank in range(4):
        mb = micro_batch(docs, DEAL, rank, 1, DEAL.rank_documents(rank)[1], PAD)
        (block,) = [b for b in mb["blocks"] if b.local_cp_size == 4]
        assert block.cu_seqlens.tolist() == [0, 30] and block.cu_seqlens_padded.tolist() == [0, 32]
        s = thd_slots(np.array([30]), 4, rank)
        a, b = block.slots
        got = mb["input_ids"][0][a:b]
        want = np.where(s.indices >= 0, int(docs.cu[j]) + 1 + s.position_ids, PAD)
        assert got.tolist() == want.tolist()
        assert mb["max_seqlen"] >= 32 and mb["degree"].tolist()[0] == 4


def test_a_rank_with_nothing_gets_an_empty_micro_batch() -> None:
    docs = step_of([4])
    deal = Deal(np.array([1]), np.array([0]), np.array([0]), np.array([1.0, 0.0]), 1)
    mb = micro_batch(docs, deal, 1, 0, deal.rank_documents(1)[0], PAD)
    assert mb["input_ids"].shape == (1, 0) and mb["blocks"] == () and mb["num_tokens"] == 0
    assert mb["max_seqlen"] == 0 and mb["cu_seqlens"].tolist() == [0]
