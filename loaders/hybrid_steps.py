"""``HybridStepLoader``: each build step dealt to the ``dp × cp`` ranks by the hybrid layout
(:func:`loaders.hybrid.deal`), as the micro-batches one rank runs.

::

    world = HybridWorld(dp=8, cp=4, capacity=16384, gpus_per_node=8)   # 32 ranks, ≤ 16384 tokens each per micro-batch
    steps = HybridStepLoader("build/demo", world, rank=dist.get_rank())
    for step in steps:                                    # HybridStep: one optimizer step, the build's step
        for mb in step.micro_batches:                     # the same number on every rank (some may be empty)
            logits = model(mb)                            # per block of mb["blocks"]: varlen attention on its group
            loss = cross_entropy(logits[0], mb["labels"][0], reduction="sum", ignore_index=-100)
            (loss / step.num_targets).backward()          # num_targets: the whole step's, all ranks together
        all_reduce(grads, op=SUM)                         # a SUM over all dp·cp ranks: the step's exact mean loss
        opt.step()
        ckpt["loader"] = steps.state_dict()               # the next step's start; resumes on any world

**The steps are the build's.** Every build step is one optimizer step, and its documents are the build's
segments of that step (documents whole, or the S-token pieces of a longer one), so no token moves between
steps and the trainer's stream is the plan's mixture exactly. Each step's documents are dealt with
:func:`loaders.hybrid.deal` (``seed`` relabels ranks per step), computed alike on every rank from the build's
metadata: no collective. A document is whole on one rank (degree 1), or split over an aligned block of ``d =
2^k`` ranks (``first_rank % d == 0``) by Transformer Engine's THD partition inside the block (the document
padded at its end to a multiple of ``2·d``, local rank ``r`` holding chunks ``r`` and ``2d − 1 − r``,
:func:`loaders.context_parallel.thd_slots`), all ranks of the block meeting it in the same micro-batch.

**A micro-batch** is one dict per rank and micro-batch, laid out by :func:`loaders.hybrid_batch.micro_batch`
(its docstring lists the fields): this rank's slots of its documents, per document its degree, block and
``cu_seqlens``, and ``blocks``, what each THD attention call over a block's process group takes.

Ranks of one block reach their shared documents in the same micro-batch and in the same order (documents
by degree, largest first, then by index: a rank is in exactly one aligned block of each degree), so the
collectives of a micro-batch's blocks run in one order on every rank; a trainer that runs them
synchronously keeps that order, and the backward pass's in reverse. Every rank runs
``deal.micro_batches`` micro-batches, an empty one (``n = 0``, no blocks) where it holds nothing.

**Loss.** :attr:`HybridStep.num_targets` is the whole step's targets (every rank's, the same number
everywhere: Σ over its documents of ``length − 1``), so each rank's summed loss over it, with gradients
summed over all ranks, is the step's exact mean; :attr:`HybridStep.rank_targets` is this rank's share.

**Resume.** ``state_dict()`` after a step is the next step's start (``{"layout": "hybrid", "version",
"build_id", "seed", "step"}``); the deal is recomputed on load, so it resumes on any world (another ``dp``,
``cp``, capacity or rank), only on the same build and seed (:class:`~loaders.state.StateError` otherwise).
A :class:`~loaders.dataset.PackedDataset` state saved at a step boundary with regrouping off (``window`` 1:
its training steps are the build's) resumes here too, at its step: a run may move to the hybrid layout there.

Megatron-core's hybrid context parallelism takes the same deal through :mod:`loaders.megatron_hybrid`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from numbers import Integral
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from contract.cost import CostModel
from loaders.config import Balance, Payload, Reading
from loaders.dataset import ExhaustedError, PackedDataset
from loaders.hybrid import Deal, HybridWorld, deal
from loaders.hybrid_batch import HybridBlock, StepDocuments, micro_batch
from loaders.items import ItemBuilder
from loaders.state import LoaderState, StateError
from loaders.varlen import concat
from loaders.world import World

__all__ = [
    "HYBRID_STATE_VERSION",
    "HybridBlock",
    "HybridStep",
    "HybridStepLoader",
    "StepDocuments",
    "step_seed",
    "steps_dataset",
]

HYBRID_STATE_VERSION = 1
_STATE_KEYS = ("layout", "version", "build_id", "seed", "step")
# what the step's documents are read with: tokens, labels made on the unsplit sequences, and where each came from
_FIELDS = ("input_ids", "labels", "cu_seqlens", "source_ids", "segments")
_T = TypeVar("_T")


def steps_dataset(build: str | Path, reading: Reading = Reading()) -> PackedDataset:
    """The build's own steps as a :class:`~loaders.dataset.PackedDataset` (no regrouping, so that its planner
    does nothing the hybrid layout would not use): what :class:`HybridStepLoader` opens a path with; open it
    once and hand it to the loaders of several ranks in one process."""
    return PackedDataset(
        build,
        world=World(),
        balance=Balance(window=1, period=0, slack=0.0),
        payload=Payload(fields=("input_ids", "cu_seqlens")),
        reading=reading,
    )


def step_seed(seed: int, step: int) -> int:
    """The deal's seed for build ``step`` of a run seeded ``seed``: a different rank relabelling every step
    (so the heaviest blocks do not land on the same ranks step after step), the same on every rank."""
    return (int(seed) << 32) + int(step)


@dataclass(frozen=True)
class HybridStep:
    """One optimizer step of one rank under the hybrid layout (see the module's docstring).

    ``micro_batches``: ``deal.micro_batches`` dicts, in order; ``deal``: the step's whole deal (every rank's);
    ``lengths`` int64 [n]: every document's tokens; ``num_tokens`` / ``num_targets``: the whole step's real
    tokens / targets (all ranks); ``rank_tokens`` / ``rank_targets``: this rank's share of them."""

    step: int
    rank: int
    micro_batches: tuple[dict[str, Any], ...]
    deal: Deal
    lengths: np.ndarray
    num_tokens: int
    num_targets: int
    rank_tokens: int
    rank_targets: int


class HybridStepLoader:
    """Iterates :class:`HybridStep` objects of ``rank`` in ``world``, one per remaining build step.

    ``build``: a build folder or URI (opened with regrouping off, ``reading`` as given), or an open
    :class:`~loaders.dataset.PackedDataset` (its shards and facts are used; its world and balance are not).
    ``world``: the ``dp × cp`` ranks and each rank's ``capacity`` of tokens per micro-batch; ``rank``: this
    process's global rank among them (``0 ≤ rank < dp·cp``; in Megatron-core, its rank in the data-parallel
    group with context parallelism). ``cost``: the deal's cost model (default: the build's, with the
    communication defaults of :mod:`contract.cost`). ``seed``: relabels the ranks of each step's deal
    (:func:`step_seed`; default: the build's seed). Raises ``ValueError`` for a rank outside the world or a
    capacity too small for the build's longest piece (``seq_len`` tokens on the largest aligned block).
    A second pass after the last step raises :class:`~loaders.dataset.ExhaustedError`; :meth:`rewind` starts
    one on purpose.
    """

    def __init__(
        self,
        build: str | Path | PackedDataset,
        world: HybridWorld,
        rank: int,
        *,
        cost: CostModel | None = None,
        seed: int | None = None,
        reading: Reading = Reading(),
    ) -> None:
        if isinstance(rank, bool) or not isinstance(rank, Integral) or not 0 <= rank < world.size:
            raise ValueError(
                f"rank {rank!r} is outside the world of {world.size} ranks (dp {world.dp} × cp {world.cp})"
            )
        ds = build if isinstance(build, PackedDataset) else steps_dataset(build, reading)
        top = 1 << (world.size.bit_length() - 1)  # the largest aligned block
        if world.capacity * top < ds.facts.seq_len:
            raise ValueError(
                f"capacity {world.capacity} tokens × the largest aligned block of {top} ranks holds less than one "
                f"{ds.facts.seq_len}-token piece of this build; raise capacity to ≥ {-(-ds.facts.seq_len // top)}"
            )
        self.dataset: PackedDataset = ds
        self.world: HybridWorld = world
        self.rank: int = int(rank)
        self.cost: CostModel = cost if cost is not None else ds.facts.cost
        self.seed: int = int(seed) if seed is not None else int(ds.facts.seed)
        self.build_id: str = ds.build_id
        self.pad_id: int = int(ds.facts.pad_id)
        self.steps: int = len(ds.planner.first) - 1  # the build's steps (planner.first: their first sequences)
        self._step: int = 0
        self._builder: ItemBuilder = ItemBuilder.whole(
            ds.shards, seq_len=ds.facts.seq_len, pad_id=self.pad_id, fields=_FIELDS
        )

    @property
    def facts(self) -> Any:
        """The run's facts (:class:`loaders.facts.RunFacts`), as the dataset's."""
        return self.dataset.facts

    def __len__(self) -> int:
        """Steps left from the loader's position."""
        return self.steps - self._step

    # -- one step -----------------------------------------------------------------------------------------

    def documents(self, step: int) -> StepDocuments:
        """Build ``step``'s documents, read whole (the same on every rank)."""
        self._check_step(step)
        first = self.dataset.planner.first
        seqs = np.arange(int(first[step]), int(first[step + 1]), dtype=np.int64)
        items: list[dict[str, Any]] = []
        feed = self._builder.feed
        for chunk in feed.chunks(((int(s),) for s in seqs), self.dataset.settings.chunk):
            items += self._builder.build([s for (s,) in chunk])
        whole = concat(items)  # new tensors: the builder's pooled arrays are not held
        cu = whole["cu_seqlens"].to(torch.int64).numpy()
        return StepDocuments(
            step=step,
            sequences=seqs,
            cu=cu,
            input_ids=whole["input_ids"],
            labels=whole["labels"],
            source_ids=whole["source_ids"],
            segments=whole["segments"],
        )

    def lengths(self, step: int) -> np.ndarray:
        """int64 [n]: build ``step``'s documents' lengths, from the build's metadata (no token is read)."""
        self._check_step(step)
        first = self.dataset.planner.first
        return self.dataset.shards.span(int(first[step]), int(first[step + 1])).segments[:, 3].astype(np.int64)

    def deal_of(self, step: int, lengths: np.ndarray | None = None) -> Deal:
        """The deal of build ``step``, every rank's (``lengths``: its documents' lengths, when already read;
        else :meth:`lengths`)."""
        lens = self.lengths(step) if lengths is None else np.asarray(lengths, dtype=np.int64)
        return deal(lens, self.world, self.cost, seed=step_seed(self.seed, step))

    def get_step(self, step: int) -> HybridStep:
        """Build ``step`` for this rank, wherever the loader stands (the position does not move)."""
        docs = self.documents(step)
        lengths = docs.lengths
        d = self.deal_of(step, lengths)
        mbs = tuple(
            micro_batch(docs, d, self.rank, m, held, self.pad_id) for m, held in enumerate(d.rank_documents(self.rank))
        )
        return HybridStep(
            step=step,
            rank=self.rank,
            micro_batches=mbs,
            deal=d,
            lengths=lengths,
            num_tokens=int(lengths.sum()),
            num_targets=docs.num_targets,
            rank_tokens=sum(int(mb["num_tokens"]) for mb in mbs),
            rank_targets=sum(int(mb["num_targets"]) for mb in mbs),
        )

    # -- iteration and resume ------------------------------------------------------------------------------

    def __iter__(self) -> Iterator[HybridStep]:
        return self.map_steps(self.get_step)

    def map_steps(self, make: Callable[[int], _T]) -> Iterator[_T]:
        """``make(step)`` for each remaining build step, in order, the position moving past each step before
        it is yielded (so that ``state_dict()`` while it trains is the next step's start); how other forms of
        a step (:mod:`loaders.megatron_hybrid`) are iterated with this loader's position and resume."""
        if 0 < self.steps <= self._step:
            raise ExhaustedError(
                f"all {self.steps} steps of this build were already read; a build is one pass of the training run: "
                "call rewind() to read it again from step 0, or load_state_dict() a saved state"
            )
        return self._map(make)

    def _map(self, make: Callable[[int], _T]) -> Iterator[_T]:
        while self._step < self.steps:
            out = make(self._step)
            self._step += 1
            yield out

    def rewind(self) -> None:
        """Start another pass over the whole build, from step 0."""
        self._step = 0

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: after a step, the start of the next one (resumes on any world)."""
        return self.state_at(self._step)

    def state_at(self, step: int) -> dict[str, Any]:
        """The state at the start of build ``step`` (``0 ≤ step ≤ steps``): what a trainer that reads ahead
        saves after training ``step − 1``."""
        if not 0 <= step <= self.steps:
            raise ValueError(f"step {step} is outside this build's 0…{self.steps} steps")
        return {
            "layout": "hybrid",
            "version": HYBRID_STATE_VERSION,
            "build_id": self.build_id,
            "seed": self.seed,
            "step": int(step),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at the step ``state`` names (takes effect at the next ``iter``), on this world or any other.

        Takes this loader's own state, or a :class:`~loaders.dataset.PackedDataset` /
        :class:`~loaders.steps.StepLoader` state saved at a step boundary with regrouping off (``window`` 1).
        Raises :class:`~loaders.state.StateError` (one line naming the field) for a malformed state, another
        build or seed, a step past the build's end, or a fixed-layout state saved inside a step or regrouped.
        """
        if not isinstance(state, dict):
            raise StateError(f"loader state is a {type(state).__name__}; expected a dict")
        if state.get("layout") != "hybrid":
            self._step = self._from_fixed(state)
            return
        if sorted(state) != sorted(_STATE_KEYS):
            raise StateError(f"hybrid loader state has fields {sorted(state)}; expected {sorted(_STATE_KEYS)}")
        if state["version"] != HYBRID_STATE_VERSION:
            raise StateError(
                f"hybrid loader state version {state['version']!r}; this loader reads {HYBRID_STATE_VERSION}"
            )
        for key in ("seed", "step"):
            v = state[key]
            if isinstance(v, bool) or not isinstance(v, Integral) or (key == "step" and v < 0):
                raise StateError(
                    f"hybrid loader state field {key!r} is {v!r}; expected a whole number" + " ≥ 0" * (key == "step")
                )
        if state["build_id"] != self.build_id:
            raise StateError(
                f"this state comes from another build (build_id {str(state['build_id'])[:12]}…, this build is "
                f"{self.build_id[:12]}…); resume with the build the run started on"
            )
        if state["seed"] != self.seed:
            raise StateError(f"state was saved with seed {state['seed']}; this loader has seed {self.seed}")
        if state["step"] > self.steps:
            raise StateError(f"loader state is at step {state['step']}; this build has {self.steps} steps")
        self._step = int(state["step"])

    def _from_fixed(self, state: dict[str, Any]) -> int:
        """The step a fixed-layout state (:class:`~loaders.state.LoaderState`) resumes at here."""
        s = LoaderState.from_dict(state)  # every field checked (StateError)
        if s.build_id != self.build_id:
            raise StateError(
                f"this state comes from another build (build_id {s.build_id[:12]}…, this build is "
                f"{self.build_id[:12]}…); resume with the build the run started on"
            )
        if s.window != 1:
            raise StateError(
                f"a fixed-layout state with window {s.window} counts regrouped training steps; the hybrid layout "
                "runs the build's steps, so it resumes only a state saved with window 1"
            )
        if s.consumed:
            raise StateError(
                f"a fixed-layout state saved inside step {s.step} ({s.consumed} sequences delivered) resumes only on "
                "its own layout; resume from a state saved at a step boundary"
            )
        if s.step > self.steps:
            raise StateError(f"loader state is at step {s.step}; this build has {self.steps} steps")
        return s.step

    def _check_step(self, step: int) -> None:
        if not 0 <= step < self.steps:
            raise ValueError(f"step {step} is outside this build's steps 0…{self.steps - 1}")
