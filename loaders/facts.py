"""``RunFacts``: what a training script needs to know about a build, typed, instead of reading its manifest.

``PackedDataset(...).facts`` holds them: ``steps`` (optimizer steps of the whole run, for the LR planner),
``seq_len``, ``global_batch``, ``vocab_size``, ``eos_id``, ``pad_id``, the cost model, the phases and the
mix's ``seed``. Every value comes from the build's ``shards/manifest.json`` (the token count and the steps
from its shards' index); a field an older or hand-written manifest lacks is None (``pad_id``: 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CostModel", "PhaseFacts", "RunFacts"]


@dataclass(frozen=True)
class CostModel:
    """The build's cost of a document of ``l`` tokens: ``attention · l² + linear · l`` (what DP balance evens)."""

    attention: float = 1.0
    linear: float = 0.0


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
    ``balance`` options; ``mix``: the mix's name.
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
    def from_manifest(cls, m: dict[str, Any], steps: int, tokens: int) -> RunFacts:
        """The facts of manifest ``m`` (already validated by :func:`mixing.format.manifest.parse_manifest`); ``steps``
        and ``tokens`` as counted from its shards."""
        cost = m.get("cost") or {}
        eos, vocab, budget = m.get("eos_id"), m.get("vocab_size"), m.get("max_tokens")
        return cls(
            mix=m.get("mix"),
            seed=int(m.get("seed") or 0),
            steps=steps,
            seq_len=int(m["seq_len"]),
            global_batch=int(m["global_batch"]),
            sequences=int(m["sequences"]),
            tokens=tokens,
            vocab_size=None if vocab is None else int(vocab),
            eos_id=None if eos is None else int(eos),
            pad_id=int(m.get("pad_id") or 0),
            micro_batches=str(m.get("micro_batches") or "equal"),
            max_tokens=None if budget is None else int(budget),
            cost=CostModel(float(cost.get("attention", 1.0)), float(cost.get("linear", 0.0))),
            phases=tuple(PhaseFacts(p["phase"], int(p["first_step"]), int(p["steps"])) for p in m.get("phases") or []),
            sources=tuple(m.get("sources") or ()),
        )
