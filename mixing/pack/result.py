"""What the packer hands out: a whole :class:`Packing`, or a :class:`PackStream` of :class:`PackedStep`.

A leaf: the packer (:mod:`mixing.pack.packing`), the shard writer (:mod:`mixing.pack.packed`) and the
reference packer the tests hold them to all import it, and it imports none of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from contract.cost import CostModel

__all__ = ["PackStream", "PackedStep", "Packing"]


@dataclass(frozen=True)
class Packing:
    """Sequences in step order.

    ``seq_step`` int64 [n_seq]; ``seg_offsets`` int64 [n_seq+1] into ``segments``; ``segments`` int64
    [n_seg, 4] = (source index, doc_id, start, length) in placement order inside each sequence.
    ``dropped`` int64 [n_drop, 4] in the same layout. ``sources`` names the source indices.
    ``cost``: the cost model the packer's ties used (:class:`~contract.cost.CostModel`).
    """

    sources: tuple[str, ...]
    seq_len: int
    seq_step: np.ndarray
    seg_offsets: np.ndarray
    segments: np.ndarray
    dropped: np.ndarray
    cost: CostModel = CostModel()

    @property
    def seg_cost(self) -> np.ndarray:
        """float64 [n_seg]: the cost of each segment."""
        return self.cost.of(self.segments[:, 3])  # type: ignore[no-any-return]

    @property
    def seq_cost(self) -> np.ndarray:
        """float64 [n_seq]: Σ segment cost per sequence."""
        return self.cost.sequences(self.seg_offsets, self.segments[:, 3])

    @property
    def seq_tokens(self) -> np.ndarray:
        """int64 [n_seq]: real (non-padding) tokens per sequence."""
        cum = np.concatenate([[0], np.cumsum(self.segments[:, 3])])
        return cum[self.seg_offsets[1:]] - cum[self.seg_offsets[:-1]]


@dataclass(frozen=True)
class PackedStep:
    """One step's ``global_batch`` sequences: ``counts`` int64 [global_batch] segments per sequence,
    ``segments`` int64 [Σ counts, 4] (source index, doc_id, start, length) sequence by sequence;
    ``dropped`` int64 [k, 4]: the units the phase left unplaced, on its last step (else empty)."""

    step: int
    counts: np.ndarray
    segments: np.ndarray
    dropped: np.ndarray


@dataclass(frozen=True)
class PackStream:
    """A packing as it is made, step by step: ``steps`` yields a :class:`PackedStep` for every step of the
    plan, in order, once (a generator: iterate it once). ``sequences``: how many sequences its steps hold in
    all; ``units``: how many units the plan has (each ends up in a sequence or dropped)."""

    sources: tuple[str, ...]
    seq_len: int
    global_batch: int
    cost: CostModel
    sequences: int
    units: int
    steps: Iterator[PackedStep]
