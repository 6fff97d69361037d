"""weir's steps in Megatron-LM, in weir's order: a map-style dataset for Megatron's sequential sampler.

Megatron's ``GPTDataset`` (what ``weir export-megatron``'s ``.bin``/``.idx`` feeds) builds its own sample
index: it shuffles the documents (``document_index``), concatenates them into ``seq_length + 1``-token
samples across document and packed-sequence bounds (``sample_index``), and shuffles the samples
(``shuffle_index``). A weir build read that way keeps its tokens but not its order: the curriculum's
phases, the per-step mixture and the DP balance are gone. To keep them, give Megatron this dataset instead
(in ``train_valid_test_datasets_provider``) with ``--dataloader-type single``, whose
``MegatronPretrainingSampler`` reads indices in order: of each ``micro_batch_size · dp`` consecutive ones,
DP rank r takes ``[r · mbs, (r + 1) · mbs)``. Sample ``i`` is laid out so that this gives rank r exactly
weir's share of each step, balanced, in weir's reading order::

    i = step · global_batch + m · (mbs · dp) + r · mbs + j   →   rank r's (m · mbs + j)-th sequence of step

Run Megatron with ``--global-batch-size`` = ``facts.global_batch`` (no batch-size ramp-up),
``--seq-length`` = ``facts.seq_len``, ``--train-iters`` = ``facts.steps``, ``--micro-batch-size`` dividing
``global_batch / dp``, and the build's ``micro_batches: equal``. Resume is Megatron's own
(``consumed_train_samples`` = ``step · global_batch``), also on another DP size: the samples of a step
are the step's sequences whatever ``dp``. Items are Megatron's GPT batch fields: ``tokens``, ``labels``
(next token; -100 replaced by ``pad_id`` since ``loss_mask`` carries the mask), ``loss_mask`` (float, 0 across
documents and on padding), ``position_ids`` (restarting at each document), and, with ``attention_mask=True``,
``attention_mask`` bool [1, S, S], True where attention is *masked* (Megatron's convention; the document
mask ``--reset-attention-mask`` would otherwise derive from EOD tokens).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from loaders import IGNORE_INDEX, Balance, PackedDataset, Reading, World


class MegatronOrder(Dataset[dict[str, torch.Tensor]]):
    """Packed sequences of ``build`` indexed for Megatron's ``MegatronPretrainingSampler`` on ``dp`` ranks with
    ``micro_batch_size`` (see the module's docstring). ``balance``, ``reading``: as :class:`loaders.PackedDataset`'s
    (its world: all ``dp`` ranks seen from rank 0, since Megatron's sampler deals the samples to ranks)."""

    def __init__(
        self,
        build: str | Path,
        dp: int,
        micro_batch_size: int,
        attention_mask: bool = False,
        *,
        balance: Balance = Balance(),
        reading: Reading = Reading(),
    ) -> None:
        self.ds = PackedDataset(build, world=World(dp_rank=0, dp_size=dp), balance=balance, reading=reading)
        self.facts, self.dp, self.mbs, self.attention_mask = self.ds.facts, dp, micro_batch_size, attention_mask
        if self.ds.settings.balance.micro_batches != "equal":
            raise ValueError("Megatron's micro-batches are of one shape: the build needs micro_batches: equal")
        if (self.facts.global_batch // dp) % micro_batch_size:
            raise ValueError(f"micro_batch_size {micro_batch_size} does not divide {self.facts.global_batch // dp}")

    def __len__(self) -> int:
        return self.facts.steps * self.facts.global_batch

    def sequence(self, i: int) -> int:
        """The build's sequence at Megatron sample ``i``."""
        step, at = divmod(i, self.facts.global_batch)
        m, rest = divmod(at, self.mbs * self.dp)
        rank, j = divmod(rest, self.mbs)
        return int(self.ds.planner.assignment(step, self.dp)[rank][m * self.mbs + j])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        item = self.ds.item(self.sequence(i))
        labels = item["labels"]
        out = {
            "tokens": item["input_ids"],
            "labels": torch.where(labels == IGNORE_INDEX, self.facts.pad_id, labels),
            "loss_mask": (labels != IGNORE_INDEX).float(),
            "position_ids": item["position_ids"],
        }
        if self.attention_mask:
            cu, S = item["cu_seqlens"].to(torch.int64), len(labels)
            doc = torch.searchsorted(cu[1:], torch.arange(S), right=True)
            allowed = torch.ones(S, S, dtype=torch.bool).tril() & (doc[:, None] == doc[None, :])
            out["attention_mask"] = ~allowed.unsqueeze(0)
        return out
