"""Variable-length micro-batches: one DP rank's sequences of a step, concatenated without their padding.

With ``balance.micro_batches: unequal`` DP ranks read different numbers of a step's packed sequences, and
``balance.max_tokens`` bounds the real tokens one rank holds: a trainer with variable-length attention
(documents delimited by ``cu_seqlens``) runs a rank's share as one micro-batch of at most that many tokens
(ByteScale's variable-length sequences up to a token budget) instead of one micro-batch per sequence.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from loaders.dataset import PackedDataset
    from loaders.loader import PackedLoader

__all__ = ["PER_SEGMENT", "PER_TOKEN", "by_step", "concat"]

PER_TOKEN = ("input_ids", "labels", "position_ids", "source_ids")  # an item's fields with one entry per slot
PER_SEGMENT = ("seg_source", "seg_doc", "seg_offset")  # an item's fields with one entry per cu_seqlens segment


def concat(items: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One micro-batch of whole-sequence items (``cp_size == 1``) of one step: ``input_ids``, ``labels``,
    ``position_ids`` (those the items carry) int64 [Σ num_tokens] and ``source_ids`` int32 (if carried),
    each item's real tokens in order with its padding left out; ``cu_seqlens`` int32 [d + 1] over the d
    documents of all of them, and ``seg_source``/``seg_doc``/``seg_offset`` [d] (if carried) aligned with it;
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
