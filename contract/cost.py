"""The cost model: what a document of ``l`` tokens costs a training step, ``attention·l² + linear·l``, and,
for the hybrid data-parallel deal (:mod:`loaders.hybrid`), what it costs split over ``d`` ranks.

Units are arbitrary cost units per document of ``l`` tokens (a sequence costs the sum over its documents):
only ratios matter, to the packer's tie-break (:mod:`mixing.pack.packing`) and to the loader's DP balance
(:mod:`loaders.balance`). The build records the model in its manifest (``cost``) and each segment's and
sequence's cost in its shards' metadata (``seg_cost``, ``seq_cost``); the loader reads them from there.

:func:`cost_formula` is the one place the formula is written; everything else calls it, numba's compiled
packing kernel included. Sums of squares and of lengths are taken over integers (exact) before the formula
is applied, so a sequence's cost does not depend on the order its documents are added in.

**Split documents.** A document of ``l`` tokens dealt to an aligned block of ``d`` ranks (context
parallelism of degree ``d``) costs each rank of the block :meth:`CostModel.time` ``= compute + comm``:

- ``compute(l, d) = of(l) / d + per_document`` (zigzag splits give each rank an equal share of the causal
  attention work; ``per_document`` is what a document costs a rank whatever its length: launches, varlen
  bookkeeping);
- ``comm(l, d, gpus_per_node)``, 0 for ``d == 1``: each rank receives the K/V of the other ranks' tokens
  of the document in the forward pass and returns their gradients in the backward pass (ring or
  all-gather context parallelism, not overlapped with compute): ``comm_bytes · l · (d − 1) / d`` bytes
  at ``bandwidth(d)`` bytes/s, plus ``group_latency`` seconds, converted to cost units by
  ``unit_seconds`` (the seconds one cost unit takes). ``bandwidth(d)`` is ``intra_bandwidth`` (by
  ``d = 2, 4, 8, …``, the last value for larger blocks) while the block fits one node
  (``d ≤ gpus_per_node``), ``inter_bandwidth`` (by nodes spanned ``2, 4, 8, …``) beyond.

``per_micro_batch`` is what every micro-batch costs every rank (the deal adds it once per micro-batch).

**Defaults** (published measurements). The communication defaults are FlexSP's (Wang et al., ASPLOS'25;
``galvatron/flexsp_solver/solver.py`` of Hetu-Galvatron, ``flexSPCostModel``) for a 7B model (32 layers,
hidden 4096, bf16) on A100 nodes of 8 GPUs: its fitted attention coefficient ``α1 = 5.128e-6 ms`` per
token² makes one cost unit ``unit_seconds = 5.128e-9`` s (so ``attention: 1.0`` is that model's
attention); its measured all-to-all bandwidth by degree ``{2: 154, 4: 137, 8: 121, 16: 8.7}`` GB/s gives
``intra_bandwidth = (154e9, 137e9, 121e9)`` and ``inter_bandwidth = (8.7e9,)`` (16 ranks span 2 nodes);
``comm_bytes = 2 (K, V) · 4096 · 2 bytes · 32 layers · 2 (forward K/V, backward dK/dV) = 1 MiB`` per
token. FlexSP's model has no latency term and DCP's (Jiang et al., SOSP'25, ``dcp/core/cost_model.py``)
defaults its latencies to 0: ``group_latency = 0``. ``per_document`` and ``per_micro_batch`` default to 0,
so ``of(l)`` and every cost the build records are what they were; the communication terms are read only
by the hybrid deal. :data:`FLEXSP_7B` is FlexSP's whole fitted model (``α2 = 0.1839576`` ms per token,
``β1 = 629.3563`` ms per group and micro-batch), in these units.
"""

from __future__ import annotations

from typing import Annotated, Any

import numpy as np
from pydantic import ConfigDict, Field, SerializerFunctionWrapHandler, Strict, model_serializer
from pydantic.dataclasses import dataclass

__all__ = ["FLEXSP_7B", "CostModel", "cost_formula"]

_Weight = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Positive = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
# a list is a tuple here (a manifest's JSON array reaches the model as a list); its items stay strict floats
_Bandwidths = Annotated[tuple[_Positive, ...], Strict(False), Field(min_length=1, max_length=32)]

# The fields a manifest written before the hybrid deal lacks: left out of the JSON at their defaults, so a
# build's manifest (and the mix file's fingerprint) is byte for byte what it was.
_HYBRID_FIELDS = (
    "per_document",
    "per_micro_batch",
    "unit_seconds",
    "comm_bytes",
    "intra_bandwidth",
    "inter_bandwidth",
    "group_latency",
)


def cost_formula(attention: float, linear: float, squares: Any, tokens: Any) -> Any:
    """``attention · squares + linear · tokens``: the cost of documents whose lengths have Σ l² = ``squares``
    and Σ l = ``tokens`` (scalars or numpy arrays alike; numba compiles it too)."""
    return attention * squares + linear * tokens


def _bit_length(x: np.ndarray) -> np.ndarray:
    """int64: the bit length of each of the non-negative ints ``x`` (exact below 2**53)."""
    return np.frexp(x.astype(np.float64))[1].astype(np.int64)


def _out(x: np.ndarray) -> Any:
    return float(x) if x.ndim == 0 else x


@dataclass(frozen=True, config=ConfigDict(strict=True))
class CostModel:
    """A document of ``l`` tokens costs ``attention · l² + linear · l`` (arbitrary units, ≥ 0 each);
    split over ``d`` ranks, :meth:`compute` + :meth:`comm` per rank (see the module's docstring for every
    field, its unit and its default's source).

    Defaults: a manifest that records no ``cost`` means ``CostModel(1.0, 0.0)`` (attention only); the mix
    file's own default (:class:`mixing.mixfile.balance.Cost`) adds a linear term. A manifest that records no
    hybrid field means that field's default.
    """

    attention: _Weight = 1.0
    linear: _Weight = 0.0
    per_document: _Weight = 0.0  # cost units per document per rank it runs on
    per_micro_batch: _Weight = 0.0  # cost units per micro-batch per rank
    unit_seconds: _Positive = 5.128e-9  # seconds per cost unit: FlexSP's α1 (7B), ms → s
    comm_bytes: _Weight = float(1 << 20)  # bytes per token received and sent back, whole model, fwd + bwd
    intra_bandwidth: _Bandwidths = (154e9, 137e9, 121e9)  # bytes/s, blocks of 2, 4, 8, … ranks in one node
    inter_bandwidth: _Bandwidths = (8.7e9,)  # bytes/s, blocks spanning 2, 4, 8, … nodes
    group_latency: _Weight = 0.0  # seconds per split document per rank of its block

    @model_serializer(mode="wrap")
    def _recorded(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for name in _HYBRID_FIELDS:
            if getattr(self, name) == _DEFAULTS[name]:
                out.pop(name, None)
        return out

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

    # -- split over d ranks (the hybrid deal) ---------------------------------------------------------------

    def compute(self, length: Any, degree: Any = 1) -> Any:
        """Per-rank compute, in cost units, of documents of ``length`` tokens each split over ``degree``
        ranks: ``of(length) / degree + per_document``. Scalars give a float, arrays (broadcast) float64."""
        d = np.asarray(degree, dtype=np.float64)
        return _out(np.asarray(self.of(length), dtype=np.float64) / d + self.per_document)

    def bandwidth(self, degree: Any, gpus_per_node: int = 8) -> Any:
        """Bytes/s each rank of a block of ``degree`` ranks exchanges K/V at (``inf`` for ``degree`` 1): the
        intra-node table while ``degree ≤ gpus_per_node``, the inter-node one by nodes spanned beyond."""
        if gpus_per_node < 1:
            raise ValueError(f"gpus_per_node is {gpus_per_node}; expected at least 1")
        d = np.maximum(np.asarray(degree, dtype=np.int64), 1)
        intra = np.asarray(self.intra_bandwidth, dtype=np.float64)
        inter = np.asarray(self.inter_bandwidth, dtype=np.float64)
        k_intra = np.clip(_bit_length(d - 1) - 1, 0, len(intra) - 1)  # d = 2 → 0, 4 → 1, …
        nodes = -(-d // gpus_per_node)
        k_inter = np.clip(_bit_length(nodes - 1) - 1, 0, len(inter) - 1)  # 2 nodes → 0, 4 → 1, …
        out = np.where(d <= gpus_per_node, intra[k_intra], inter[k_inter])
        return _out(np.where(d == 1, np.inf, out))

    def comm(self, length: Any, degree: Any, gpus_per_node: int = 8) -> Any:
        """Per-rank communication, in cost units, of documents of ``length`` tokens split over ``degree``
        ranks: 0 where ``degree`` is 1, else ``(comm_bytes · length · (d − 1) / d / bandwidth(d) +
        group_latency) / unit_seconds``. Scalars give a float, arrays (broadcast) float64."""
        l = np.asarray(length, dtype=np.float64)  # noqa: E741
        d = np.asarray(degree, dtype=np.int64)
        volume = self.comm_bytes * l * (d - 1) / np.maximum(d, 1)
        seconds = volume / self.bandwidth(d, gpus_per_node) + self.group_latency
        return _out(np.where(d > 1, seconds / self.unit_seconds, 0.0))

    def time(self, length: Any, degree: Any = 1, gpus_per_node: int = 8) -> Any:
        """Predicted per-rank time, in cost units, of documents of ``length`` tokens split over ``degree``
        ranks: :meth:`compute` + :meth:`comm`."""
        return _out(
            np.asarray(self.compute(length, degree), dtype=np.float64)
            + np.asarray(self.comm(length, degree, gpus_per_node), dtype=np.float64)
        )


_DEFAULTS: dict[str, Any] = {name: getattr(CostModel(), name) for name in _HYBRID_FIELDS}

# FlexSP's fitted compute model of a 7B model (32 layers, hidden 4096; galvatron's flexsp_solver):
# α1 = 5.128e-6 ms·token⁻², α2 = 0.1839576 ms·token⁻¹, β1 = 629.3563 ms per group and micro-batch.
FLEXSP_7B = CostModel(attention=1.0, linear=0.1839576 / 5.128e-6, per_micro_batch=629.3563 / 5.128e-6)
