"""``RunFacts``: what a training script needs to know about a build, typed, instead of reading its manifest.

``PackedDataset(...).facts`` holds them: ``steps`` (optimizer steps of the whole run, for the LR planner),
``seq_len``, ``global_batch``, ``vocab_size``, ``eos_id``, ``pad_id``, the cost model, the phases, the
source names (``sources``, in source-index order) and the mix's ``seed``. Every value comes from the build's
typed manifest (:class:`contract.manifest.Manifest`, whose defaults fill what an older or hand-written
manifest lacks), the token count and the steps from its shards' index. ``CostModel`` is the build's
(:class:`contract.cost.CostModel`).
"""

from __future__ import annotations

from dataclasses import dataclass

from contract.cost import CostModel
from contract.manifest import Manifest

__all__ = ["CostModel", "PhaseFacts", "RunFacts"]


@dataclass(frozen=True)
class PhaseFacts:
    """A curriculum phase: ``steps`` optimizer steps from ``first_step`` on."""

    name: str
    first_step: int
    steps: int


@dataclass(frozen=True)
class RunFacts:
    """A build's facts for the trainer.

    ``steps``: optimizer steps in the whole run (each holds ``global_batch`` packed sequences of ``seq_len``
    slots, whatever the world); ``sequences``/``tokens``: packed sequences and real (non-padding) tokens of
    the whole build; ``vocab_size``: the embedding's rows; ``eos_id``: the id ending each document (None if
    unrecorded); ``pad_id``: the id in padding slots, the tokenizer's pad token when it has one, else the EOS
    id (``pad_is_eos``): then mask padding with ``labels == -100`` or ``num_tokens``, never by id;
    ``seed``: the mix file's seed, the loader's default; ``micro_batches``/``max_tokens``: the mix file's
    ``balance`` options; ``mix``: the mix's name; ``sources``: the source names in the order of the shards'
    source indices (an item's ``source_ids`` and ``segments[:, 0]`` index them; empty when the build records none).
    """

    mix: str | None
    seed: int
    steps: int
    seq_len: int
    global_batch: int
    sequences: int
    tokens: int
    vocab_size: int | None
    eos_id: int | None
    pad_id: int
    micro_batches: str
    max_tokens: int | None
    cost: CostModel
    phases: tuple[PhaseFacts, ...]
    sources: tuple[str, ...]

    @property
    def tokens_per_step(self) -> int:
        """Slots per optimizer step, padding included (``seq_len · global_batch``)."""
        return self.seq_len * self.global_batch

    @property
    def pad_is_eos(self) -> bool:
        """True when padding holds the EOS id (the tokenizer has no pad token): ``input_ids == pad_id`` would
        also hit every document's last token."""
        return self.eos_id is not None and self.pad_id == self.eos_id

    @classmethod
    def from_manifest(cls, m: Manifest, steps: int, tokens: int) -> RunFacts:
        """The facts of manifest ``m``; ``steps`` and ``tokens`` as counted from its shards. Raises
        ``ValueError`` when it records no ``global_batch`` (which the loader needs)."""
        if m.global_batch is None:
            raise ValueError("the manifest records no global_batch, which the loader needs")
        return cls(
            mix=m.mix,
            seed=m.seed,
            steps=steps,
            seq_len=m.seq_len,
            global_batch=m.global_batch,
            sequences=m.sequences,
            tokens=tokens,
            vocab_size=m.vocab_size,
            eos_id=m.eos_id,
            pad_id=m.pad_id,
            micro_batches=m.micro_batches,
            max_tokens=m.max_tokens,
            cost=m.cost,
            phases=tuple(PhaseFacts(p.phase, p.first_step, p.steps) for p in m.phases or ()),
            sources=m.sources or (),
        )
