"""The loss per source, on the trainer's device: what a data-mixing run plots first.

An item asked for ``source_ids`` (``Payload(fields=(..., "source_ids"))``, :mod:`loaders.fields`) says which
source each of its slots came from; :func:`loss_per_source` sums a step's per-token losses by source::

    ds = PackedDataset("build/demo", payload=Payload(fields=("input_ids", "labels", "source_ids")))
    n = len(ds.facts.sources)                                    # names in source-index order
    losses = cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="none")
    loss_sum, tokens = loss_per_source(losses, labels, source_ids, n)   # float64 [n], int64 [n]
    reduce_per_source(loss_sum, tokens)                          # all-reduce SUM over every rank (DP × CP)
    mean = loss_sum / tokens.clamp(min=1)                        # per source; tokens == 0: no target there

A trainer of whole sequences (``cp_size == 1``) may ask for the per-segment ``segments`` instead, one tensor per
item rather than an int32 per slot, and expand it on its device with :func:`slot_sources`::

    source_ids = slot_sources(mb["segments"], mb["cu_seqlens"], mb["input_ids"].numel())

Shapes and dtypes: ``losses`` floating [...] (any shape: [B, S], [N], a CP rank's [n]), ``labels`` integer
and ``source_ids`` integer (the item's int32) of the same shape on the same device. A position counts where
its label is not :data:`~loaders.fields.IGNORE_INDEX` and its source is ≥ 0 (padding is -1, and its label is
ignored anyway); its loss goes to the source of the token *at* that position (the one whose next token it
predicts: both lie in one document, since a document's last token has no label). The results are
``loss_sum`` float64 [n_sources] and ``tokens`` int64 [n_sources] on ``losses``' device, made with torch
ops only (no host synchronisation). Each rank's slots are disjoint (DP: other sequences; CP: other slots of
the same ones), so the sums over all ranks equal the sums over the whole step computed in one place.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from loaders.fields import IGNORE_INDEX

__all__ = ["loss_per_source", "reduce_per_source", "slot_sources"]


def loss_per_source(
    losses: torch.Tensor, labels: torch.Tensor, source_ids: torch.Tensor, n_sources: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-source ``(loss_sum float64 [n_sources], tokens int64 [n_sources])`` of per-token ``losses`` (see
    the module's docstring): positions whose label is ``IGNORE_INDEX`` or whose source is < 0 count nowhere
    (their loss may be anything, NaN included). ``ValueError`` when the shapes differ; a source id
    ≥ ``n_sources`` is an error of the device's scatter (``n_sources`` is ``len(ds.facts.sources)``)."""
    if losses.shape != labels.shape or losses.shape != source_ids.shape:
        raise ValueError(
            f"losses {tuple(losses.shape)}, labels {tuple(labels.shape)} and source_ids "
            f"{tuple(source_ids.shape)} must have one shape"
        )
    device = losses.device
    src = source_ids.reshape(-1).to(device=device, dtype=torch.int64)
    keep = (labels.reshape(-1).to(device) != IGNORE_INDEX) & (src >= 0)
    at = src.masked_fill(~keep, 0)
    values = losses.reshape(-1).to(torch.float64).masked_fill(~keep, 0.0)  # a NaN where no label is: 0
    loss_sum = torch.zeros(n_sources, dtype=torch.float64, device=device).scatter_add_(0, at, values)
    tokens = torch.zeros(n_sources, dtype=torch.int64, device=device).scatter_add_(0, at, keep.to(torch.int64))
    return loss_sum, tokens


def slot_sources(segments: torch.Tensor, cu_seqlens: torch.Tensor, slots: int) -> torch.Tensor:
    """int64 [slots]: the source index of each slot of a whole-sequence batch (``cp_size == 1``: a stacked or
    varlen ``StepLoader`` micro-batch, a ``varlen.by_step`` batch, an item), -1 on padding, from its
    ``segments`` int64 [k, 3] and ``cu_seqlens`` [k + 1] on their device; ``slots`` = ``cu_seqlens[-1]``, given
    by the caller as the batch's ``input_ids.numel()`` (known on the host), so that the expansion never waits for
    the device (``repeat_interleave`` without its output size synchronizes with the host). Equal to the batch's
    ``source_ids`` widened to int64. Under CP a rank holds pieces of the segments: ask for ``source_ids``.
    ``ValueError`` when the shapes do not fit (checked on the host)."""
    if segments.dim() != 2 or segments.shape[1] != 3 or cu_seqlens.shape != (segments.shape[0] + 1,):
        raise ValueError(
            f"segments {tuple(segments.shape)} and cu_seqlens {tuple(cu_seqlens.shape)} must be [k, 3] and [k + 1]:"
            " one batch's segments and its cu_seqlens"
        )
    cu = cu_seqlens.to(torch.int64)
    return torch.repeat_interleave(segments[:, 0], cu[1:] - cu[:-1], output_size=slots)


def reduce_per_source(
    loss_sum: torch.Tensor, tokens: torch.Tensor, group: dist.ProcessGroup | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """All-reduce (SUM, in place) one rank's :func:`loss_per_source` over ``group`` (default: every rank, DP
    and CP); returns them. Every rank of the group must call it."""
    dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM, group=group)
    dist.all_reduce(tokens, op=dist.ReduceOp.SUM, group=group)
    return loss_sum, tokens
