"""The hybrid layout (:mod:`loaders.hybrid_steps`) as Megatron-core's hybrid context parallelism consumes it:
per step, the sub-samples this rank runs and, per group (micro-batch) and rank, the sub-sample ids, with no
collective (Megatron-core's own wrapper all-gathers the lengths and all-to-alls the samples every step).

Matched against NVIDIA/Megatron-LM ``main`` at commit d98e8a64ddf34856e74b24714e3bedb2f5a39553:

- ``megatron/core/pipeline_parallel/hybrid_cp_schedule.py``, ``hybrid_context_parallel_forward_backward``
  (what ``forward_backward_no_pipelining`` runs when ``config.hybrid_context_parallel`` is set): it calls
  ``next(data_iterator)`` once per global batch and reads ``data[0]``, a dict from sub-sample id to the
  sub-sample, and ``data[1]``, ``sample_id_groups[group][hdp_rank]``, the ids each rank of the
  data-parallel-with-context-parallel ("hdp") group runs in each group; for each id of its own list, in
  order, it sets ``sample["local_cp_size"]`` to the number of ranks whose list in that group holds the id and
  runs one forward and backward; a barrier on the hdp group ends each group. It reads the last sub-sample of
  the last group by index, so every rank needs at least one sub-sample there;
- ``megatron/core/datasets/data_schedule.py``, ``HybridCPDataLoaderWrapper.__next__``: returns exactly that
  pair, ``(samples_this_rank_with_id, sample_id_groups)``; this module's :class:`MegatronHybridBatches` takes
  its place (``train_data_iterator = iter(MegatronHybridBatches(loader))``);
- ``megatron/core/utils.py``, ``get_batch_on_this_cp_rank`` (called by ``pretrain_gpt.get_batch``): with
  hybrid CP and ``local_cp_size > 1`` it cuts every tensor of the sub-sample whole into ``2·local_cp_size``
  equal chunks and keeps chunks ``r`` and ``2·local_cp_size − 1 − r`` (per-sequence zigzag) on the group that
  ``parallel_state.get_hybrid_data_context_parallel_groups(group_size=local_cp_size)`` gives; for one
  document padded at its end to a multiple of ``2·local_cp_size`` that is Transformer Engine's THD partition,
  :mod:`loaders.hybrid_steps`' cut;
- ``megatron/core/parallel_state.py``, ``create_hybrid_dp_cp_groups``: the groups are ``ranks[i : i + size]``
  of the hdp ranks, aligned, for ``size`` = 2, 4, … below the hdp size, and the whole hdp group: the deal's
  aligned blocks, when ``dp·cp`` is a power of two (otherwise its largest block has no group and
  :class:`MegatronHybridBatches` refuses a step that uses it).

Each sub-sample is one whole document of the step, padded at its end to a multiple of ``2·degree`` (degree
1: unpadded): ``tokens``, ``labels``, ``position_ids`` int64 [1, L], ``loss_mask`` float32 [1, L] (1 where the
label is a target; ``labels`` hold 0 elsewhere, never -100, which Megatron's vocabulary-parallel loss would
index), ``cu_seqlens`` int32 [1, 2] (``[0, l]``, the real length), ``cu_seqlens_padded`` int32 [1, 2]
(``[0, L]``), ``max_seqlen`` int32 [1] (``L``) and ``local_cp_size`` int32 [1] (its degree; the schedule sets
it again). A rank that holds no document in a group gets a filler there, one pad token with ``loss_mask`` 0,
id ``n + rank`` (``n`` the step's documents): Megatron-core's schedule expects every rank to run something in
every group (its own scheduler fills empty ranks too); its loss and gradient are exactly 0.

Megatron-core's ``dev`` branch (commit d48bd6be0a85cc0d6d3cc71e8750cf357cc6bdb1) generalizes this as dynamic
context parallelism (``DefaultDynamicCPScheduler`` in ``megatron/core/datasets/data_schedule.py``): after
scheduling, each rank's sub-samples of a group are packed into one THD micro-batch with one
``local_cp_size`` (``data_schedule_utils.build_packed_microbatches``), which
``get_batch_on_this_rank_for_sequence_packing(dynamic_cp=True)`` cuts by Transformer Engine's partition on
``get_dynamic_data_context_parallel_groups(group_size=local_cp_size)``. That needs every rank's ids of a group
on one block: :func:`sample_id_groups` with ``one_block=True`` splits each micro-batch into one group per
degree present (fillers where a rank holds none of that degree), and :func:`pack_group` packs a rank's
sub-samples of a group as that micro-batch (``tokens``, ``labels``, ``loss_mask``, ``position_ids`` [T];
``cu_seqlens``, ``cu_seqlens_padded`` int32 [k + 1]; ``max_seqlen``, ``local_cp_size`` int32).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from loaders.fields import IGNORE_INDEX
from loaders.hybrid import Deal
from loaders.hybrid_steps import HybridStepLoader, StepDocuments

__all__ = ["MegatronHybridBatches", "megatron_groups", "pack_group", "sample_id_groups", "sub_sample"]


def megatron_groups(hdp_size: int) -> tuple[int, ...]:
    """The hybrid CP group sizes Megatron-core creates for ``hdp_size`` data-parallel × context-parallel
    ranks (``create_hybrid_dp_cp_groups``: 2, 4, … below ``2^floor(log2 hdp_size)``, and ``hdp_size``); 1
    needs no group."""
    top = hdp_size.bit_length() - 1  # floor(log2)
    return (1, *(1 << i for i in range(1, top)), *((hdp_size,) if hdp_size > 1 else ()))


def sample_id_groups(d: Deal, *, one_block: bool = False, fill: bool = True) -> list[list[list[int]]]:
    """Per group, per rank (``len(d.rank_time)`` of them), the sub-sample ids that rank runs, in order.

    A document ``j`` (its id) is in the group of its micro-batch on every rank of its block, and the ranks of
    a block list their shared ids in the same order (degree descending, then index). ``one_block``: each
    micro-batch becomes one group per degree present in it (largest first), so that all of a rank's ids in a
    group are on one block. ``fill``: a rank with no document in a group gets the filler id ``n + rank``
    (:func:`sub_sample` of nothing), so that every rank runs at least one sub-sample in every group.
    """
    ranks, n = len(d.rank_time), len(d.degree)
    order = np.lexsort((np.arange(n), -d.degree, d.micro_batch))  # micro-batch, degree descending, index
    # each document's group key: its micro-batch, and with one_block its degree (largest first)
    key = np.stack([d.micro_batch, -d.degree if one_block else np.zeros(n, np.int64)], axis=1)
    if one_block:
        keys = sorted({(int(m), int(g)) for m, g in key.tolist()})
    else:  # every micro-batch is a group, also one where no rank holds anything
        keys = [(m, 0) for m in range(d.micro_batches)]
    where = {k: g for g, k in enumerate(keys)}
    groups: list[list[list[int]]] = [[[] for _ in range(ranks)] for _ in keys]
    for j in order.tolist():
        first, size = int(d.first_rank[j]), int(d.degree[j])
        group = groups[where[(int(key[j, 0]), int(key[j, 1]))]]
        for r in range(first, first + size):
            group[r].append(j)
    if fill:
        for group in groups:
            for r, ids in enumerate(group):
                if not ids:
                    ids.append(n + r)
    return groups


def sub_sample(docs: StepDocuments | None, j: int, degree: int, pad_id: int) -> dict[str, torch.Tensor]:
    """Document ``j`` of ``docs`` as Megatron-core's sub-sample (fields: the module's docstring), padded at its
    end to a multiple of ``2·degree`` (``degree`` 1: unpadded); ``docs`` None: the filler (one ``pad_id``
    token, no target)."""
    if docs is None:
        ids, labels = torch.tensor([pad_id], dtype=torch.int64), torch.tensor([IGNORE_INDEX], dtype=torch.int64)
    else:
        a, b = int(docs.cu[j]), int(docs.cu[j + 1])
        ids, labels = docs.input_ids[a:b], docs.labels[a:b]
    length = len(ids)
    two = 2 * degree if degree > 1 else 1
    padded = -(-length // two) * two
    tokens = torch.full((1, padded), pad_id, dtype=torch.int64)
    tokens[0, :length] = ids
    target = torch.full((1, padded), IGNORE_INDEX, dtype=torch.int64)
    target[0, :length] = labels
    mask = target != IGNORE_INDEX
    return {
        "tokens": tokens,
        "labels": torch.where(mask, target, torch.zeros_like(target)),  # a valid id where nothing is learned
        "loss_mask": mask.to(torch.float32),
        # counting on through the padding, as Transformer Engine's generate_positional_ids_for_cp does
        "position_ids": torch.arange(padded, dtype=torch.int64).unsqueeze(0),
        "cu_seqlens": torch.tensor([[0, length]], dtype=torch.int32),
        "cu_seqlens_padded": torch.tensor([[0, padded]], dtype=torch.int32),
        "max_seqlen": torch.tensor([padded], dtype=torch.int32),
        "local_cp_size": torch.tensor([degree], dtype=torch.int32),
    }


def pack_group(samples: dict[int, dict[str, torch.Tensor]], ids: list[int]) -> dict[str, torch.Tensor]:
    """One rank's sub-samples ``ids`` of a group (all on one block: ``sample_id_groups(one_block=True)``)
    packed as Megatron-core's dynamic-CP micro-batch (``data_schedule_utils._pack_sequences`` of the ``dev``
    branch): ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` [T] (the sub-samples, padded, end to end),
    ``cu_seqlens`` / ``cu_seqlens_padded`` int32 [k + 1] (real / padded lengths), ``max_seqlen`` int32 (the
    longest padded one) and ``local_cp_size`` int32. Raises ``ValueError`` for ids on blocks of different
    sizes."""
    if not ids:
        raise ValueError("no sub-samples to pack")
    parts = [samples[i] for i in ids]
    sizes = {int(p["local_cp_size"].reshape(-1)[0]) for p in parts}
    if len(sizes) != 1:
        raise ValueError(f"sub-samples of a packed group must share one local_cp_size, got {sorted(sizes)}")
    out = {
        key: torch.cat([p[key].reshape(-1) for p in parts]) for key in ("tokens", "labels", "loss_mask", "position_ids")
    }
    real = torch.tensor([int(p["cu_seqlens"].reshape(-1)[-1]) for p in parts], dtype=torch.int64)
    padded = torch.tensor([int(p["cu_seqlens_padded"].reshape(-1)[-1]) for p in parts], dtype=torch.int64)
    zero = torch.zeros(1, dtype=torch.int64)
    out["cu_seqlens"] = torch.cat([zero, real.cumsum(0)]).to(torch.int32)
    out["cu_seqlens_padded"] = torch.cat([zero, padded.cumsum(0)]).to(torch.int32)
    out["max_seqlen"] = padded.max().to(torch.int32)
    out["local_cp_size"] = torch.tensor(sizes.pop(), dtype=torch.int32)
    return out


class MegatronHybridBatches:
    """Per remaining step of ``loader`` (this rank's :class:`~loaders.hybrid_steps.HybridStepLoader`), the pair
    Megatron-core's ``hybrid_context_parallel_forward_backward`` takes from ``next(data_iterator)``:
    ``(samples, sample_id_groups)`` (see the module's docstring); ``samples`` holds only this rank's
    sub-samples (its documents and its fillers). ``one_block``: groups split per degree
    (:func:`sample_id_groups`), for the packed dynamic-CP form (:func:`pack_group`).

    The loader's rank is the hdp rank (``parallel_state.get_data_parallel_rank(with_context_parallel=True)``);
    the tensor-parallel ranks of one hdp rank build the same pairs (Megatron-core reads them on TP rank 0
    only). Megatron-core's hybrid CP runs without pipeline parallelism. ``state_dict`` / ``load_state_dict``
    are the loader's: after a pair is taken, the next step's start. A step whose deal uses a block size
    Megatron-core has no group for (:func:`megatron_groups`) raises ``ValueError``.
    """

    def __init__(self, loader: HybridStepLoader, *, one_block: bool = False) -> None:
        self.loader, self.one_block = loader, one_block
        self.sizes = megatron_groups(loader.world.size)

    def __iter__(self) -> Iterator[tuple[dict[int, dict[str, Any]], list[list[list[int]]]]]:
        return self.loader.map_steps(self.pair)

    def pair(self, step: int) -> tuple[dict[int, dict[str, Any]], list[list[list[int]]]]:
        """Build ``step``'s ``(samples, sample_id_groups)`` for the loader's rank (the position does not move)."""
        loader = self.loader
        docs = loader.documents(step)
        d = loader.deal_of(step, docs.lengths)
        missing = sorted(set(np.unique(d.degree).tolist()) - set(self.sizes))
        if missing:
            raise ValueError(
                f"step {step}'s deal splits documents over {missing} ranks; Megatron-core creates hybrid CP groups "
                f"of {list(self.sizes)} for {loader.world.size} ranks (use a power of two for dp·cp)"
            )
        groups = sample_id_groups(d, one_block=self.one_block)
        n, pad = len(d.degree), loader.pad_id
        mine = sorted({i for group in groups for i in group[loader.rank]})
        samples = {
            i: sub_sample(docs, i, int(d.degree[i]), pad) if i < n else sub_sample(None, 0, 1, pad) for i in mine
        }
        return samples, groups

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """The loader's state: after a pair was taken, the next step's start."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The loader's :meth:`~loaders.hybrid_steps.HybridStepLoader.load_state_dict`."""
        self.loader.load_state_dict(state)
