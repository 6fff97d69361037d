"""One rank's micro-batch of a step under the hybrid layout, as :class:`loaders.hybrid_steps.HybridStepLoader`
hands it out, and the step's documents it is cut from.

**A micro-batch** (one dict per rank and micro-batch; ``n`` this rank's slots, ``k`` its documents):

- ``input_ids``, ``labels``, ``position_ids``, ``indices`` int64 [1, n] and ``source_ids`` int32 [1, n]: the
  rank's slots of its documents, in order; labels are the next token inside the document (-100 at each
  document's last token), made on the unsplit document, so a split document's chunk ends with the label of a
  token another rank holds; CP padding holds ``pad_id``, -100, the THD position (counting on through the
  padding, as Transformer Engine's ``generate_positional_ids_for_cp`` makes it), index -1 and source -1;
  ``indices`` is each slot's position among the micro-batch's documents laid whole end to end (the
  coordinates of ``cu_seqlens``);
- per document, int [k] or [k + 1]: ``documents`` (the document's index in the step, the deal's index),
  ``degree``, ``first_rank``, ``cu_seqlens`` int32 [k + 1] (real lengths), ``cu_seqlens_padded`` int32 [k + 1]
  (each rounded up to a multiple of ``2·degree``, unpadded at degree 1), ``cu_slots`` int32 [k + 1] (where
  each document's slots begin among this rank's: its padded length ÷ its degree), ``segments`` int64 [k, 3]
  (source index, document id, offset of the piece in its document: :mod:`loaders.fields`);
  ``max_seqlen`` (int): the longest padded document, 0 for none;
- ``blocks``: a tuple of :class:`HybridBlock`, one per degree present, largest first: the block's global
  ``ranks``, ``local_cp_size``, this rank's ``local_cp_rank``, its documents' and slots' ranges in the
  micro-batch, and the ``cu_seqlens``, ``cu_seqlens_padded``, ``max_seqlen`` that a THD attention call over
  the block's process group takes (Transformer Engine's ``DotProductAttention`` with ``cp_group`` the block's
  ranks; degree 1: plain varlen attention over ``cu_seqlens``);
- ``step``, ``micro_batch`` (its index), ``num_tokens`` (real tokens among this rank's slots) and
  ``num_targets`` (labels that are not -100 among them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from loaders.context_parallel import thd_slots
from loaders.fields import IGNORE_INDEX
from loaders.hybrid import Deal

__all__ = ["HybridBlock", "StepDocuments", "micro_batch"]


@dataclass(frozen=True)
class StepDocuments:
    """A build step's ``n`` documents: its sequences' segments in order (whole documents, or pieces of longer
    ones), read whole. ``sequences`` int64 [g]: the step's global sequence indices; ``cu`` int64 [n + 1]:
    document ``j`` is ``input_ids[cu[j]:cu[j+1]]``; ``input_ids``, ``labels`` int64 [T] and ``source_ids``
    int32 [T] (``T = cu[-1]``, the step's real tokens; labels -100 at each document's last token);
    ``segments`` int64 [n, 3]: each document's source index, id and offset of the piece in its document."""

    step: int
    sequences: np.ndarray
    cu: np.ndarray
    input_ids: torch.Tensor
    labels: torch.Tensor
    source_ids: torch.Tensor
    segments: torch.Tensor

    @property
    def lengths(self) -> np.ndarray:
        """int64 [n]: each document's tokens."""
        return np.diff(self.cu)

    @property
    def num_targets(self) -> int:
        """Labels of the step that are not -100: each document's tokens but its last."""
        return int(self.cu[-1]) - (len(self.cu) - 1)


@dataclass(frozen=True)
class HybridBlock:
    """The documents of one micro-batch that this rank shares with the same ranks (one degree).

    ``ranks``: the block's global ranks (``local_cp_size`` of them, aligned: the first a multiple of the
    size); ``local_cp_rank``: this rank's place in it; ``documents`` / ``slots``: ``[start, stop)`` of the
    block's documents among the micro-batch's ``k`` and of their slots among its ``n``; ``cu_seqlens`` /
    ``cu_seqlens_padded`` int32 [documents + 1] (real lengths / each rounded up to a multiple of
    ``2·local_cp_size``, from 0) and ``max_seqlen`` (the longest padded one): the whole documents', the same on
    every rank of the block, as Transformer Engine's THD attention takes them (it divides them by the CP size
    itself)."""

    ranks: tuple[int, ...]
    local_cp_size: int
    local_cp_rank: int
    documents: tuple[int, int]
    slots: tuple[int, int]
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor
    max_seqlen: int


def micro_batch(docs: StepDocuments, d: Deal, rank: int, m: int, held: np.ndarray, pad_id: int) -> dict[str, Any]:
    """Global ``rank``'s micro-batch ``m`` of a step dealt by ``d``: its documents ``held`` (degree descending,
    then index, :meth:`loaders.hybrid.Deal.rank_documents`) cut for it, padding slots holding ``pad_id``; the
    fields are the module docstring's."""
    lengths = docs.lengths[held]
    degree, first = d.degree[held], d.first_rank[held]
    k = len(held)
    # per slot: where its token lies among the step's tokens (T: a padding slot), its THD position and
    # its position among the micro-batch's documents laid whole end to end
    where, position, index = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    cu_slots, blocks = [0], []
    slot0, real0, T = 0, 0, int(docs.cu[-1])
    bounds = np.flatnonzero(np.diff(degree)) + 1  # degree descending: each run is one block
    for a, b in zip([0, *bounds.tolist()], [*bounds.tolist(), k], strict=True):
        if a == b:
            continue
        size, start = int(degree[a]), int(first[a])
        local = rank - start
        s = thd_slots(lengths[a:b], size, local)
        seg = np.searchsorted(s.cu_seqlens_padded[1:], s.padded, side="right")  # each slot's document
        real = s.indices >= 0
        where.append(np.where(real, docs.cu[held[a:b]][seg] + s.position_ids, T))
        position.append(s.position_ids)
        index.append(np.where(real, s.indices + real0, -1))
        padded = np.diff(s.cu_seqlens_padded.astype(np.int64))
        cu_slots += (slot0 + np.cumsum(padded // size)).tolist()
        blocks.append(
            HybridBlock(
                ranks=tuple(range(start, start + size)),
                local_cp_size=size,
                local_cp_rank=local,
                documents=(a, b),
                slots=(slot0, slot0 + len(s.padded)),
                cu_seqlens=torch.from_numpy(s.cu_seqlens),
                cu_seqlens_padded=torch.from_numpy(s.cu_seqlens_padded),
                max_seqlen=int(padded.max()),
            )
        )
        slot0 += len(s.padded)
        real0 += int(s.cu_seqlens[-1])
    gather = torch.from_numpy(np.concatenate(where))

    def take(values: torch.Tensor, fill: int) -> torch.Tensor:
        # one gather per field; the appended slot T is what a padding slot reads
        return torch.cat([values, values.new_full((1,), fill)])[gather].unsqueeze(0)

    labels = take(docs.labels, IGNORE_INDEX)
    two = np.where(degree > 1, 2 * degree, 1)
    pcu = np.zeros(k + 1, np.int64)
    np.cumsum(-(-lengths // two) * two, out=pcu[1:])
    cu = np.zeros(k + 1, np.int64)
    np.cumsum(lengths, out=cu[1:])
    sel = torch.from_numpy(held)
    return {
        "input_ids": take(docs.input_ids, pad_id),
        "labels": labels,
        "position_ids": torch.from_numpy(np.concatenate(position)).unsqueeze(0),
        "indices": torch.from_numpy(np.concatenate(index)).unsqueeze(0),
        "source_ids": take(docs.source_ids, -1),
        "documents": sel.clone(),
        "degree": torch.from_numpy(degree.copy()),
        "first_rank": torch.from_numpy(first.copy()),
        "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
        "cu_seqlens_padded": torch.from_numpy(pcu.astype(np.int32)),
        "cu_slots": torch.tensor(cu_slots, dtype=torch.int32),
        "max_seqlen": int(np.diff(pcu).max()) if k else 0,
        "segments": docs.segments[sel],
        "blocks": tuple(blocks),
        "step": docs.step,
        "micro_batch": m,
        "num_tokens": int((gather < T).sum()),
        "num_targets": int((labels != IGNORE_INDEX).sum()),
    }
