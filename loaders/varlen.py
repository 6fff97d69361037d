"""Variable-length micro-batches: one DP rank's sequences of a step, concatenated without their padding.

With ``balance.micro_batches: unequal`` DP ranks read different numbers of a step's packed sequences, and
``balance.max_tokens`` bounds the real tokens one rank holds: a trainer with variable-length attention
(documents delimited by ``cu_seqlens``) runs a rank's share as one micro-batch of at most that many tokens
(ByteScale's variable-length sequences up to a token budget) instead of one micro-batch per sequence.

Under context parallelism a micro-batch's documents are cut for the CP ranks (:mod:`loaders.context_parallel`):
:func:`thd_cut` cuts a whole micro-batch (:func:`concat`'s) as Transformer Engine's THD format does,
:func:`concat_zigzag` joins items the loader already cut by weir's own ``"zigzag"``. Either gives one CP
rank's slots of the micro-batch's documents, trailing padding left out as :func:`concat` leaves it out:
``input_ids``, ``labels``, ``position_ids`` int64 [n] and ``source_ids`` int32 [n] (those the input carries;
CP padding holds ``pad_id``, -100, the split's position and -1), ``indices`` int64 [n] (each slot's position
among the micro-batch's real tokens, -1 for CP padding), and, the same on every CP rank, ``cu_seqlens`` int32
[d + 1] over the d documents' real lengths, ``cu_seqlens_padded`` int32 [d + 1] over their lengths padded to
multiples of 2·cp (``n = cu_seqlens_padded[-1] / cp``), ``segments`` int64 [d, 3] (if carried: each
document's source index, id and offset, :mod:`loaders.fields`), ``step``, ``sequences`` and ``num_tokens``
(the whole micro-batch's real tokens, all ranks together).
Labels are the loader's, made on the unsplit documents: each real token's target is the next token of its
document wherever the two land, so the loss summed over the CP ranks is the unsplit loss.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from loaders.context_parallel import cu_seqlens_padded, document_zigzag, thd_slots
from loaders.fields import IGNORE_INDEX

if TYPE_CHECKING:
    from loaders.dataset import PackedDataset
    from loaders.loader import PackedLoader

__all__ = ["PER_SEGMENT", "PER_TOKEN", "by_step", "concat", "concat_zigzag", "thd_cut"]

PER_TOKEN = ("input_ids", "labels", "position_ids", "source_ids")  # an item's fields with one entry per slot
PER_SEGMENT = ("segments",)  # an item's fields with one row per cu_seqlens segment


def concat(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One micro-batch of whole-sequence items (``cp_size == 1``) of one step: ``input_ids``, ``labels``,
    ``position_ids`` (those the items carry) int64 [Σ num_tokens] and ``source_ids`` int32 (if carried),
    each item's real tokens in order with its padding left out; ``cu_seqlens`` int32 [d + 1] over the d
    documents of all of them, and ``segments`` int64 [d, 3] (if carried) aligned with it;
    ``step``; ``sequences`` (their global indices) and ``num_tokens`` (Σ). Labels stay as the loader made
    them (-100 at each document's last token), so nothing crosses from one sequence into the next.
    """
    if not items:
        raise ValueError("no items to concatenate")
    if len({int(it["step"]) for it in items}) != 1:
        raise ValueError("items of different steps; a micro-batch holds one step's sequences")
    keys = [key for key in PER_TOKEN if key in items[0]]
    if any(len(it[key]) != int(it["cu_seqlens"][-1]) for it in items for key in keys):
        raise ValueError("concat takes whole-sequence items (cp_size == 1)")
    counts = [int(it["num_tokens"]) for it in items]
    out: dict[str, Any] = {key: torch.cat([it[key][:n] for it, n in zip(items, counts, strict=True)]) for key in keys}
    bounds, offset = [torch.zeros(1, dtype=torch.int32)], 0
    for it, n in zip(items, counts, strict=True):
        cu = it["cu_seqlens"]
        bounds.append(cu[(cu > 0) & (cu <= n)] + offset)  # the document ends; trailing padding is dropped
        offset += n
    out["cu_seqlens"] = torch.cat(bounds).to(torch.int32)
    per_segment = [key for key in PER_SEGMENT if key in items[0]]
    if per_segment:  # each item's documents, its trailing padding's segment (the last, if any) left out
        docs = [int((it["cu_seqlens"][1:] <= n).sum()) for it, n in zip(items, counts, strict=True)]
        for key in per_segment:
            out[key] = torch.cat([it[key][:d] for it, d in zip(items, docs, strict=True)])
    out.update(step=int(items[0]["step"]), sequences=[int(it["sequence"]) for it in items], num_tokens=offset)
    return out


def thd_cut(batch: dict[str, Any], cp_size: int, cp_rank: int, pad_id: int) -> dict[str, Any]:
    """CP rank ``cp_rank``'s share of ``batch``, a whole micro-batch as :func:`concat` makes it, cut by
    Transformer Engine's THD partition (:func:`loaders.context_parallel.thd_slots`): every document padded at
    its end to a multiple of ``2·cp_size``, the rank holding chunks ``cp_rank`` and ``2·cp_size − 1 −
    cp_rank`` of each. Fields and shapes: the module's docstring; ``position_ids`` (if ``batch`` carries them)
    count on through each document's padding, as Transformer Engine's ``generate_positional_ids_for_cp``
    makes them; ``pad_id`` fills the padding's ``input_ids``."""
    cu = batch["cu_seqlens"].to(torch.int64).numpy()
    slots = thd_slots(np.diff(cu), cp_size, cp_rank)
    idx = torch.from_numpy(slots.indices)
    real, src = idx >= 0, idx.clamp(min=0)
    out: dict[str, Any] = {}
    for key, fill in (("input_ids", pad_id), ("labels", IGNORE_INDEX), ("source_ids", -1)):
        if key in batch:
            taken = batch[key][src]
            out[key] = torch.where(real, taken, torch.full_like(taken, fill))
    if "position_ids" in batch:
        out["position_ids"] = torch.from_numpy(slots.position_ids)
    out["indices"] = idx
    out["cu_seqlens"] = batch["cu_seqlens"]
    out["cu_seqlens_padded"] = torch.from_numpy(slots.cu_seqlens_padded)
    out.update({key: batch[key] for key in PER_SEGMENT if key in batch})
    out.update(step=batch["step"], sequences=batch["sequences"], num_tokens=batch["num_tokens"])
    return out


def concat_zigzag(items: Sequence[dict[str, Any]], cp_size: int, cp_rank: int) -> dict[str, Any]:
    """One micro-batch of items of one step that the loader cut for CP rank ``cp_rank`` by ``"zigzag"``
    (:func:`loaders.context_parallel.document_zigzag`: front padding, the chunk pair rotating from one
    document to the next inside each sequence): each item's slots of its documents in order, the slots of
    its trailing padding left out. Fields and shapes: the module's docstring (CP padding keeps the items'
    values: ``pad_id``, -100, position 0, source -1)."""
    if not items:
        raise ValueError("no items to concatenate")
    if len({int(it["step"]) for it in items}) != 1:
        raise ValueError("items of different steps; a micro-batch holds one step's sequences")
    keys = [key for key in PER_TOKEN if key in items[0]]
    parts: dict[str, list[torch.Tensor]] = {key: [] for key in keys}
    indices, cus, pcus = [np.zeros(0, np.int64)], [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
    docs_of, offset, padded = [], 0, 0
    for it in items:
        cu = it["cu_seqlens"].to(torch.int64).numpy()
        seg, n = np.diff(cu), int(it["num_tokens"])
        docs = int((cu[1:] <= n).sum())  # the trailing padding, if any, is the last segment
        pcu = cu_seqlens_padded(seg, cp_size).astype(np.int64)
        if any(len(it[key]) != pcu[-1] // cp_size for key in keys):
            raise ValueError("concat_zigzag takes items cut by the 'zigzag' split for this cp_size")
        keep = int(pcu[docs]) // cp_size  # each segment's slots follow the segments' order
        for key in keys:
            parts[key].append(it[key][:keep])
        idx = document_zigzag(seg, cp_size, cp_rank)[:keep]
        indices.append(np.where(idx >= 0, idx + offset, -1))
        cus.append(cu[1 : docs + 1] + offset)
        pcus.append(pcu[1 : docs + 1] + padded)
        docs_of.append(docs)
        offset, padded = offset + n, padded + int(pcu[docs])
    out: dict[str, Any] = {key: torch.cat(parts[key]) for key in keys}
    out["indices"] = torch.from_numpy(np.concatenate(indices))
    out["cu_seqlens"] = torch.from_numpy(np.concatenate(cus).astype(np.int32))
    out["cu_seqlens_padded"] = torch.from_numpy(np.concatenate(pcus).astype(np.int32))
    for key in PER_SEGMENT:
        if key in items[0]:
            out[key] = torch.cat([it[key][:d] for it, d in zip(items, docs_of, strict=True)])
    out.update(step=int(items[0]["step"]), sequences=[int(it["sequence"]) for it in items], num_tokens=offset)
    return out


def by_step(loader: PackedLoader | PackedDataset) -> Iterator[dict[str, Any]]:
    """:func:`concat` of each step's items of ``loader`` (a :class:`~loaders.loader.PackedLoader` or a
    :class:`~loaders.dataset.PackedDataset` iterated in this process), this rank's share of every step.

    A micro-batch is yielded as soon as its step's last item arrives (the planner says how many items
    this rank reads in each step), never after reading ahead: ``loader.state_dict()`` after each one is
    the next step's start, so a resume from it (in this world or, at that boundary, any other) continues
    with the next micro-batch.
    """
    ds: Any = getattr(loader, "dataset", loader)
    if getattr(ds, "planner", None) is None:
        raise TypeError(f"by_step takes a PackedLoader or PackedDataset, not {type(loader).__name__}")
    group: list[dict[str, Any]] = []
    for item in loader:
        group.append(item)
        step = int(item["step"])
        if int(item["slot"]) + 1 == ds.count(step):
            yield concat(group)
            group = []
    if group:  # cannot happen with a whole stream; kept rather than dropped
        yield concat(group)
