"""``StepLoader``: one optimizer step of this DP rank at a time, as the micro-batches a model takes.

A :class:`~loaders.dataset.PackedDataset` yields single packed sequences; a training step is this rank's
``ds.count(step)`` of them (``global_batch / dp_size`` with equal counts). ``StepLoader`` groups them::

    steps = StepLoader(PackedLoader(ds, num_workers=2))      # or StepLoader(ds)
    for step in steps:                                       # Step: one optimizer step of this rank
        for mb in step.micro_batches:                        # one unless micro_batch= splits the step
            logits = model(mb["input_ids"], cu_seqlens=mb["cu_seqlens"], max_seqlen=mb["max_seqlen"])
            loss = cross_entropy(logits.flatten(0, 1), mb["labels"].flatten(), reduction="sum")
            (loss / step.num_targets).backward()            # or all-reduce num_targets for a global mean
        opt.step(); sched.step()                             # ds.facts.steps steps in the whole run
        ckpt["loader"] = steps.state_dict()                  # exact here: the next step's start, any world

Micro-batch layouts (``layout``; default ``"stacked"`` with the mix's ``micro_batches: equal``, else
``"varlen"``):

- ``"stacked"``: ``input_ids``, ``labels``, ``position_ids`` (those the items carry) int64 [b, S], each row a
  packed sequence with its trailing padding (``labels`` -100 there); ``source_ids`` int32 [b, S] if carried.
- ``"varlen"``: the same fields [1, T], the sequences' real tokens back to back, padding left out
  (:func:`loaders.varlen.concat`; T ≤ the mix's ``balance.max_tokens`` with ``micro_batches: unequal``).

Either way ``cu_seqlens`` int32 [d + 1] are the segment bounds over the micro-batch's flattened slots
(``b·S`` or ``T``; with ``"stacked"`` each row's trailing padding is a segment of its own, so that no
document attends to padding), the items' ``seg_source``/``seg_doc``/``seg_offset`` (if carried) are
aligned with those segments, and ``max_seqlen`` (int) is the longest segment: what flash-attention's
``flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, causal=True)`` takes for
``q`` of shape [b·S or T, heads, dim]. Each micro-batch also has ``step``, ``sequences`` (global indices),
``num_tokens`` (real tokens) and ``num_targets`` (labels that are not -100: the cross-entropy's terms).

``state_dict()`` after a step is the start of the next one (a step boundary: it resumes on this world or
any other dp size); :meth:`StepLoader.state_at` gives the state at the start of any step, for a trainer
whose framework reads batches ahead (it saves the state of the step it trained, not of what was read).
Whole sequences only (``cp_size == 1``); with context parallelism use the item stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from loaders.dataset import PackedDataset
from loaders.loader import PackedLoader
from loaders.varlen import PER_SEGMENT, PER_TOKEN, concat

__all__ = ["LAYOUTS", "Step", "StepLoader", "stack"]

LAYOUTS = ("stacked", "varlen")


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


class StepLoader:
    """Iterates :class:`Step` objects, one per remaining optimizer step of this DP rank.

    ``loader``: a :class:`~loaders.loader.PackedLoader` (workers, pinned memory) or a
    :class:`~loaders.dataset.PackedDataset` (read in this process); its items need ``cu_seqlens``.
    ``layout``: ``"stacked"`` or ``"varlen"`` (default by the dataset's ``micro_batches``).
    ``micro_batch``: sequences per micro-batch (gradient accumulation; default: all of the rank's step in
    one); a step's last micro-batch holds the rest. Like the loader, a second pass after the last step
    raises :class:`~loaders.dataset.ExhaustedError`; :meth:`rewind` starts one on purpose.
    """

    def __init__(
        self, loader: PackedLoader | PackedDataset, layout: str | None = None, micro_batch: int | None = None
    ) -> None:
        ds = loader.dataset if isinstance(loader, PackedLoader) else loader
        if not isinstance(ds, PackedDataset):
            raise TypeError(f"StepLoader takes a PackedLoader or PackedDataset, not {type(loader).__name__}")
        if ds.world.cp_size != 1:
            raise ValueError("StepLoader groups whole sequences (cp_size 1); with cp_size > 1 iterate the items")
        if "cu_seqlens" not in ds.settings.fields:
            raise ValueError("StepLoader needs the items' cu_seqlens; add 'cu_seqlens' to the dataset's payload fields")
        layout = layout or ("stacked" if ds.settings.balance.micro_batches == "equal" else "varlen")
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if micro_batch is not None and micro_batch < 1:
            raise ValueError(f"micro_batch must be ≥ 1 sequence, got {micro_batch}")
        self.loader, self.dataset, self.layout, self.micro_batch = loader, ds, layout, micro_batch

    @property
    def facts(self) -> Any:
        """The run's facts (:class:`loaders.facts.RunFacts`), as the dataset's."""
        return self.dataset.facts

    def __len__(self) -> int:
        """Optimizer steps left from the loader's position (a step begun counts)."""
        state = self.loader.state_dict()
        return self.dataset.planner.steps - int(state["step"])

    def __iter__(self) -> Iterator[Step]:
        ds, build = self.dataset, stack if self.layout == "stacked" else _varlen
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
