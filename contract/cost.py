"""The cost model: what a document of ``l`` tokens costs a training step, ``attention·l² + linear·l``.

Units are arbitrary cost units per document of ``l`` tokens (a sequence costs the sum over its documents):
only ratios matter, to the packer's tie-break (:mod:`mixing.pack.packing`) and to the loader's DP balance
(:mod:`loaders.balance`). The build records the model in its manifest (``cost``) and each segment's and
sequence's cost in its shards' metadata (``seg_cost``, ``seq_cost``); the loader reads them from there.

:func:`cost_formula` is the one place the formula is written; everything else calls it, numba's compiled
packing kernel included. Sums of squares and of lengths are taken over integers (exact) before the formula
is applied, so a sequence's cost does not depend on the order its documents are added in.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass

__all__ = ["CostModel", "cost_formula"]

_Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]


def cost_formula(attention: float, linear: float, squares: Any, tokens: Any) -> Any:
    """``attention · squares + linear · tokens``: the cost of documents whose lengths have Σ l² = ``squares``
    and Σ l = ``tokens`` (scalars or numpy arrays alike; numba compiles it too)."""
    return attention * squares + linear * tokens


@dataclass(frozen=True, config=ConfigDict(strict=True))
class CostModel:
    """A document of ``l`` tokens costs ``attention · l² + linear · l`` (arbitrary units, ≥ 0 each).

    Defaults: a manifest that records no ``cost`` means ``CostModel(1.0, 0.0)`` (attention only); the mix
    file's own default (:class:`mixing.mixfile.parts.Cost`) adds a linear term.
    """

    attention: _Weight = 1.0
    linear: _Weight = 0.0

    def of(self, length: Any) -> Any:
        """Cost of documents of ``length`` tokens: a float for a scalar, float64 of the same shape for an array
        (ints or floats)."""
        l = np.asarray(length, dtype=np.float64)  # noqa: E741
        out = cost_formula(self.attention, self.linear, l * l, l)
        return float(out) if out.ndim == 0 else out

    def sequences(self, seg_offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """float64 [n]: cost of each of ``n`` sequences, sequence ``i`` holding the documents
        ``lengths[seg_offsets[i]:seg_offsets[i+1]]`` (int, ``seg_offsets`` int [n+1])."""
        off = np.asarray(seg_offsets, dtype=np.int64)
        l = np.asarray(lengths, dtype=np.int64)  # noqa: E741
        sq = np.concatenate([[0], np.cumsum(l * l)])  # int64: exact
        tok = np.concatenate([[0], np.cumsum(l)])
        squares = (sq[off[1:]] - sq[off[:-1]]).astype(np.float64)
        tokens = (tok[off[1:]] - tok[off[:-1]]).astype(np.float64)
        return np.asarray(cost_formula(self.attention, self.linear, squares, tokens), dtype=np.float64)

    def sequence(self, lengths: Any) -> float:
        """Cost of one sequence holding documents of ``lengths`` tokens (ints)."""
        l = np.asarray(lengths, dtype=np.int64).reshape(-1)  # noqa: E741
        return float(self.sequences(np.array([0, len(l)]), l)[0])
