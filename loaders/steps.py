"""``StepLoader``: one optimizer step of this DP rank at a time, as the micro-batches a model takes.

A :class:`~loaders.dataset.PackedDataset` yields single packed sequences; a training step is this rank's
``ds.count(step)`` of them (``global_batch / dp_size`` with equal counts). ``StepLoader`` groups them::

    steps = StepLoader(PackedLoader(ds, num_workers=2))      # or StepLoader(ds)
    for step in steps:                                       # Step: one optimizer step of this rank
        for mb in step.micro_batches:                        # ≤ 8192 tokens each by default (below)
            logits = model(mb["input_ids"], cu_seqlens=mb["cu_seqlens"], max_seqlen=mb["max_seqlen"])
            loss = cross_entropy(logits.flatten(0, 1), mb["labels"].flatten(), reduction="sum")
            (loss / step.num_targets).backward()            # or all-reduce num_targets for a global mean
        opt.step(); sched.step()                             # ds.facts.steps steps in the whole run
        ckpt["loader"] = steps.state_dict()                  # exact here: the next step's start, any world

Micro-batch size. A micro-batch's logits are its tokens × the vocabulary, and a rank's whole step is
often far more than a GPU holds: at S = 4096 and 32 sequences per rank, 131,072 tokens × a 129,280-token
vocabulary are 33.9 GB of bf16 logits, 67.8 GB in fp32. So by default a micro-batch holds at most
``micro_batch_tokens`` = :data:`MICRO_BATCH_TOKENS` = 8192 token slots: 8192 × 131,072 (a 128k vocabulary) ×
2 bytes = 2 GiB of bf16 logits (4 GiB once a loss upcasts them to fp32, as much again for their gradient).
Slots, not real tokens, are counted: ``S`` per sequence, ``S / cp_size`` per sequence on a CP rank, so that a
micro-batch holds ``max(1, micro_batch_tokens // (S / cp_size))`` sequences on every DP and CP rank alike
(with equal counts every rank runs the same number of micro-batches, as FSDP and pipeline schedules need;
with ``micro_batches: unequal`` the ranks' numbers differ as their sequences do, so such a trainer passes
``micro_batch_tokens=None`` and bounds the step by the mix's ``balance.max_tokens``), and never less than one
sequence (at S = 32768 without CP a micro-batch is one 32,768-token sequence: 8 GiB of bf16 logits at a 128k
vocabulary; use CP or a chunked loss there). ``micro_batch=k`` sets the sequences per micro-batch instead,
``micro_batch_tokens=None`` makes the rank's whole step one micro-batch.
:attr:`StepLoader.micro_batch` is the number in force (``None``: the whole step).

Micro-batch layouts (``layout``; default ``"stacked"`` with the mix's ``micro_batches: equal``, else
``"varlen"``):

- ``"stacked"``: ``input_ids``, ``labels``, ``position_ids`` (those the items carry) int64 [b, S], each row a
  packed sequence with its trailing padding (``labels`` -100 there); ``source_ids`` int32 [b, S] if carried.
- ``"varlen"``: the same fields [1, T], the sequences' real tokens back to back, padding left out
  (:func:`loaders.varlen.concat`; T ≤ the mix's ``balance.max_tokens`` with ``micro_batches: unequal``).

Either way ``cu_seqlens`` int32 [d + 1] are the segment bounds over the micro-batch's flattened slots
(``b·S`` or ``T``; with ``"stacked"`` each row's trailing padding is a segment of its own, so that no
document attends to padding), the items' ``segments`` rows (if carried) are aligned with those segments,
and ``max_seqlen`` (int) is the longest segment: what flash-attention's
``flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)`` takes for
``q`` of shape [b·S or T, heads, dim]. Each micro-batch also has ``step``, ``sequences`` (global indices),
``num_tokens`` (real tokens) and ``num_targets`` (labels that are not -100: the cross-entropy's terms).

``state_dict()`` after a step is the start of the next one (a step boundary: it resumes on this world or
any other dp size); :meth:`StepLoader.state_at` gives the state at the start of any step, for a trainer
whose framework reads batches ahead (it saves the state of the step it trained, not of what was read).

With context parallelism (``cp_size > 1``) every micro-batch is this CP rank's share of the micro-batch the
DP rank would get whole, ``"varlen"`` only (documents padded for the split make rows of unequal lengths; the
trailing padding is left out), cut by the dataset's ``cp_split`` (:mod:`loaders.varlen`'s docstring has the
fields)::

    ds = PackedDataset(build, world=World.detect(cp_size=4), cp_split="thd")
    for step in StepLoader(ds, micro_batch=2):
        for mb in step.micro_batches:  # input_ids, labels, position_ids, indices [1, n]; n = cu_seqlens_padded[-1] / 4
            # Transformer Engine: DotProductAttention(..., qkv_format="thd", attn_mask_type="padding_causal") with
            # set_context_parallel_group(...), called with cu_seqlens_q = cu_seqlens_kv = mb["cu_seqlens"],
            # cu_seqlens_q_padded = cu_seqlens_kv_padded = mb["cu_seqlens_padded"], max_seqlen_q/kv = mb["max_seqlen"]
            (loss_sum / step.num_targets).backward()  # num_targets: all CP ranks' targets together

- ``"thd"``: Transformer Engine's THD partition, as Megatron-core uses it for packed sequences (each
  document padded at its end to a multiple of 2·cp, rank ``r`` holding chunks ``r`` and ``2·cp − 1 − r``);
  ``cu_seqlens`` (real lengths), ``cu_seqlens_padded`` and ``max_seqlen`` (the longest padded document) are
  the whole micro-batch's, as Transformer Engine takes them (it divides them by ``cp_size`` itself); the
  padding's ``position_ids`` count on as Transformer Engine's ``generate_positional_ids_for_cp`` makes them.
  The dataset's items cut each sequence as one segment, so for ``"thd"`` this rank's sequences are read
  whole once more, in this process, and cut here.
- ``"zigzag"``: weir's own per-document split (front padding, the chunk pair rotating from one document to
  the next), balanced to ``cp_imbalance`` ≤ 1.01 but not a layout Transformer Engine's kernels assume: for
  an attention that all-gathers K/V and masks by position (``indices``). The items as the loader cut them.

``num_tokens`` and ``num_targets`` of a step or micro-batch are the whole DP rank's (every CP rank gets the
same numbers), so that the losses summed over the CP ranks, over ``num_targets``, are the unsplit mean.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from loaders.dataset import PackedDataset
from loaders.items import ItemBuilder
from loaders.loader import PackedLoader
from loaders.varlen import PER_SEGMENT, PER_TOKEN, concat, concat_zigzag, thd_cut

__all__ = ["CP_SPLITS", "LAYOUTS", "MICRO_BATCH_TOKENS", "Step", "StepLoader", "stack"]

LAYOUTS = ("stacked", "varlen")
CP_SPLITS = ("thd", "zigzag")  # the splits StepLoader cuts micro-batches by when cp_size > 1
# token slots of one micro-batch by default: 8192 × a 128k vocabulary × 2 bytes = 2 GiB of bf16 logits
MICRO_BATCH_TOKENS = 8192


@dataclass(frozen=True)
class Step:
    """One optimizer step of this DP rank: ``micro_batches`` (see the module's docstring) in reading order,
    ``sequences`` their global indices, ``num_tokens`` / ``num_targets`` their sums."""

    step: int
    micro_batches: tuple[dict[str, Any], ...]
    sequences: tuple[int, ...]
    num_tokens: int
    num_targets: int


def _targets(item: dict[str, Any]) -> int:
    """Labels of ``item`` that are not -100: each real token but the last of each document."""
    n = int(item["num_tokens"])
    return n - int((item["cu_seqlens"][1:] <= n).sum())


def stack(items: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``"stacked"`` micro-batch of whole-sequence items of one step (see the module's docstring)."""
    if not items:
        raise ValueError("no items to stack")
    S = int(items[0]["cu_seqlens"][-1])
    out: dict[str, Any] = {key: torch.stack([it[key] for it in items]) for key in PER_TOKEN if key in items[0]}
    bounds = [it["cu_seqlens"][:-1].to(torch.int32) + r * S for r, it in enumerate(items)]
    cu = torch.cat([*bounds, torch.tensor([len(items) * S], dtype=torch.int32)])
    out.update({key: torch.cat([it[key] for it in items]) for key in PER_SEGMENT if key in items[0]})
    out.update(
        cu_seqlens=cu,
        max_seqlen=int((cu[1:] - cu[:-1]).max()),
        step=int(items[0]["step"]),
        sequences=[int(it["sequence"]) for it in items],
        num_tokens=sum(int(it["num_tokens"]) for it in items),
        num_targets=sum(_targets(it) for it in items),
    )
    return out


def _varlen(items: list[dict[str, Any]]) -> dict[str, Any]:
    out = concat(items)
    for key in PER_TOKEN:
        if key in out:
            out[key] = out[key].unsqueeze(0)
    cu = out["cu_seqlens"]
    out["max_seqlen"] = int((cu[1:] - cu[:-1]).max()) if len(cu) > 1 else 0
    out["num_targets"] = sum(_targets(it) for it in items)
    return out


def _cp_finish(out: dict[str, Any], items: list[dict[str, Any]]) -> dict[str, Any]:
    """A CP micro-batch (:func:`loaders.varlen.thd_cut` or :func:`~loaders.varlen.concat_zigzag`) as
    ``"varlen"`` lays it out: per-slot fields [1, n], ``max_seqlen`` the longest padded document (the
    whole micro-batch's: Transformer Engine divides it by ``cp_size`` itself), ``num_targets`` all CP
    ranks' targets together."""
    for key in (*PER_TOKEN, "indices"):
        if key in out:
            out[key] = out[key].unsqueeze(0)
    pcu = out["cu_seqlens_padded"]
    out["max_seqlen"] = int((pcu[1:] - pcu[:-1]).max()) if len(pcu) > 1 else 0
    out["num_targets"] = sum(_targets(it) for it in items)
    return out


class StepLoader:
    """Iterates :class:`Step` objects, one per remaining optimizer step of this DP rank.

    ``loader``: a :class:`~loaders.loader.PackedLoader` (workers, pinned memory) or a
    :class:`~loaders.dataset.PackedDataset` (read in this process); its items need ``cu_seqlens``.
    ``layout``: ``"stacked"`` or ``"varlen"`` (default by the dataset's ``micro_batches``).
    ``micro_batch``: sequences per micro-batch (gradient accumulation); when set, ``micro_batch_tokens`` is
    not used. ``micro_batch_tokens``: when ``micro_batch`` is None, the token slots one micro-batch may hold
    (default :data:`MICRO_BATCH_TOKENS`; ``S / cp_size`` slots per sequence, at least one sequence per
    micro-batch; the module's docstring has the arithmetic); None: the rank's whole step in one micro-batch.
    A step's last micro-batch holds the rest. :attr:`micro_batch` is the sequences per micro-batch in force
    (None: the whole step). Like the loader, a second pass after the last step raises
    :class:`~loaders.dataset.ExhaustedError`; :meth:`rewind` starts one on purpose.
    Raises ``ValueError`` for a ``micro_batch`` or ``micro_batch_tokens`` below 1.
    """

    def __init__(
        self,
        loader: PackedLoader | PackedDataset,
        layout: str | None = None,
        micro_batch: int | None = None,
        *,
        micro_batch_tokens: int | None = MICRO_BATCH_TOKENS,
    ) -> None:
        ds = loader.dataset if isinstance(loader, PackedLoader) else loader
        if not isinstance(ds, PackedDataset):
            raise TypeError(f"StepLoader takes a PackedLoader or PackedDataset, not {type(loader).__name__}")
        if "cu_seqlens" not in ds.settings.fields:
            raise ValueError("StepLoader needs the items' cu_seqlens; add 'cu_seqlens' to the dataset's payload fields")
        cp = ds.world.cp_size
        if cp > 1 and ds.settings.cp_split not in CP_SPLITS:
            raise ValueError(
                f"StepLoader cuts micro-batches by cp_split {CP_SPLITS} when cp_size > 1, not "
                f"{ds.settings.cp_split!r}; iterate the items for that split"
            )
        layout = layout or ("stacked" if ds.settings.balance.micro_batches == "equal" and cp == 1 else "varlen")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if cp > 1 and layout != "varlen":
            raise ValueError(
                f"layout {layout!r} needs whole sequences; with cp_size {cp} a micro-batch is 'varlen' (documents "
                "padded for the CP split give every row its own length)"
            )
        if micro_batch is not None and micro_batch < 1:
            raise ValueError(f"micro_batch must be ≥ 1 sequence, got {micro_batch}")
        if micro_batch_tokens is not None and micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens must be ≥ 1 token, got {micro_batch_tokens}")
        if micro_batch is None and micro_batch_tokens is not None:
            slots = -(-ds.facts.seq_len // cp)  # a sequence's slots on this CP rank (its documents' CP padding aside)
            micro_batch = max(1, micro_batch_tokens // slots)
        self.loader, self.dataset, self.layout = loader, ds, layout
        self.micro_batch: int | None = micro_batch  # sequences per micro-batch; None: the rank's whole step
        self.micro_batch_tokens = micro_batch_tokens
        self._whole: ItemBuilder | None = None
        if cp > 1 and ds.settings.cp_split == "thd":
            # the items cut each sequence as one segment: read this DP rank's sequences whole (labels made
            # before any cut) and cut their documents here
            wanted = {"input_ids", "labels", "cu_seqlens"} | {
                f for f in ds.settings.fields if f in PER_TOKEN or f in PER_SEGMENT
            }
            self._whole = ItemBuilder.whole(ds.shards, seq_len=ds.facts.seq_len, pad_id=ds.facts.pad_id, fields=wanted)

    @property
    def facts(self) -> Any:
        """The run's facts (:class:`loaders.facts.RunFacts`), as the dataset's."""
        return self.dataset.facts

    def __len__(self) -> int:
        """Optimizer steps left from the loader's position (a step begun counts)."""
        state = self.loader.state_dict()
        return self.dataset.planner.steps - int(state["step"])

    def __iter__(self) -> Iterator[Step]:
        ds = self.dataset
        build = self._cut if ds.world.cp_size > 1 else stack if self.layout == "stacked" else _varlen
        group: list[dict[str, Any]] = []
        for item in self.loader:
            group.append(item)
            if int(item["slot"]) + 1 < ds.count(int(item["step"])):
                continue
            k = self.micro_batch or len(group)
            # the step's last item is in: yield before reading on, so that state_dict() is the next step's start
            yield Step(
                step=int(item["step"]),
                micro_batches=tuple(build(group[i : i + k]) for i in range(0, len(group), k)),
                sequences=tuple(int(it["sequence"]) for it in group),
                num_tokens=sum(int(it["num_tokens"]) for it in group),
                num_targets=sum(_targets(it) for it in group),
            )
            group = []

    def _cut(self, items: list[dict[str, Any]]) -> dict[str, Any]:
        """This CP rank's micro-batch of ``items`` (one step's, cut by the dataset's ``cp_split``)."""
        world = self.dataset.world
        if self._whole is None:  # 'zigzag': the items are this rank's slots already
            return _cp_finish(concat_zigzag(items, world.cp_size, world.cp_rank), items)
        whole = self._whole.build([int(it["sequence"]) for it in items])
        for w, it in zip(whole, items, strict=True):
            w["step"] = it["step"]  # the training step (regrouping moves sequences between the build's steps)
        cut = thd_cut(concat(whole), world.cp_size, world.cp_rank, self.dataset.facts.pad_id)
        return _cp_finish(cut, items)

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: after a step, the start of the next one."""
        return self.loader.state_dict()

    def state_at(self, step: int) -> dict[str, Any]:
        """The state at the start of training ``step`` (``0 ≤ step ≤ facts.steps``), whatever was read: what
        a trainer that reads ahead saves after training ``step − 1``. It resumes on any world."""
        ds, steps = self.dataset, self.dataset.planner.steps
        if not 0 <= step <= steps:
            raise ValueError(f"step {step} is outside this build's 0…{steps} steps")
        return ds.state_at(step, -1) if step < steps else ds.state_at(steps - 1, ds.count(steps - 1) - 1)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state`` (takes effect at the next ``iter``); see :meth:`PackedDataset.load_state_dict`."""
        self.loader.load_state_dict(state)

    def rewind(self) -> None:
        """Start another pass over the whole build, from step 0."""
        self.loader.rewind()
