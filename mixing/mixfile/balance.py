"""The mix file's ``balance`` section: how the loader spreads a step's work over DP ranks.

Frozen pydantic models (unknown fields are errors), assembled into :class:`~mixing.mixfile.mix.Mix` as its
``balance`` field: :class:`Balance` holds the :class:`Cost` model a build packs with (and records) and the
optional outlier delay :class:`Regroup`. Their defaults live once, in the build contract
(:class:`contract.cost.CostModel`, :class:`contract.record.Regroup`); a cost field left at its default stays
out of the mix's fingerprint, so a mix that sets none builds what it built before.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from contract.cost import CostModel
from contract.record import Regroup as _Recorded
from mixing.mixfile.parts import FrozenModel

__all__ = ["Balance", "Cost", "Regroup"]

_CostWeight = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Bandwidths = Annotated[
    tuple[Annotated[float, Field(gt=0, allow_inf_nan=False)], ...], Field(min_length=1, max_length=32)
]
_MODEL = CostModel()  # the hybrid fields' defaults live once, in the build contract


class Cost(FrozenModel):
    """The mix file's ``balance.cost``: the build's cost model (:class:`contract.cost.CostModel`, a
    document of ``l`` tokens costs ``attention·l² + linear·l``), here with the mix file's defaults.

    The other fields price a document split over ``d`` ranks for the hybrid deal (``loaders.hybrid``) and
    default to the build contract's (FlexSP's measurements): ``per_document`` and ``per_micro_batch`` (cost
    units), ``unit_seconds`` (seconds per cost unit, > 0), ``comm_bytes`` (bytes per token),
    ``intra_bandwidth`` and ``inter_bandwidth`` (lists of bytes/s, > 0, by block size inside a node and by
    nodes spanned), ``group_latency`` (seconds). A field left at its default stays out of the mix's
    fingerprint and the manifest, so a mix that sets none builds what it built before.
    """

    attention: _CostWeight = 1.0
    linear: _CostWeight = 8192.0
    per_document: _CostWeight = _MODEL.per_document
    per_micro_batch: _CostWeight = _MODEL.per_micro_batch
    unit_seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)] = _MODEL.unit_seconds
    comm_bytes: _CostWeight = _MODEL.comm_bytes
    intra_bandwidth: _Bandwidths = _MODEL.intra_bandwidth
    inter_bandwidth: _Bandwidths = _MODEL.inter_bandwidth
    group_latency: _CostWeight = _MODEL.group_latency

    @model_serializer(mode="wrap")
    def _given(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        for name in type(self).model_fields:
            if name not in ("attention", "linear") and getattr(self, name) == getattr(_MODEL, name):
                out.pop(name, None)
        return out

    def model(self) -> CostModel:
        """The cost model these weights make (what the build packs with and records)."""
        fields = {name: getattr(self, name) for name in type(self).model_fields}
        return CostModel(**fields)


_RECORDED = _Recorded()  # the defaults live once, in the build contract


class Regroup(FrozenModel):
    """Outlier delay for one sequence per DP rank at long context (``loaders.balance.regroup_window``): the
    sequences of ``window`` consecutive steps of a phase are regrouped into steps of similar cost, laid out
    by a cost template repeating every ``period`` steps, and refined under the balance bound ``slack``
    (``loaders.refinement``) so that every ``period``-step window keeps the build's mixture. Each phase's
    length becomes a multiple of ``period`` (a partial block at a phase's end cannot keep the mixture)."""

    window: Annotated[int, Field(ge=2, le=100_000)] = _RECORDED.window
    period: Annotated[int, Field(ge=1, le=100_000)] = _RECORDED.period
    slack: Annotated[float, Field(ge=1.0, allow_inf_nan=False)] = _RECORDED.slack


class Balance(FrozenModel):
    """How the loader spreads work over DP ranks (``loaders.balance``).

    ``micro_batches``: ``equal`` (default) gives every DP rank ``global_batch / dp_size`` sequences per step;
    ``unequal`` (ByteScale-style) lets the counts differ (at least one each) so that each rank's Σ cost is
    even: for a trainer that accumulates gradients over a variable number of micro-batches and normalizes its
    loss by tokens. It changes which rank reads which sequence of a step, never the steps themselves.
    ``max_tokens`` (with ``unequal`` only): the most real tokens one DP rank may hold in a step, the memory
    budget of a variable-length micro-batch (a rank's sequences concatenated without their padding,
    ``loaders.varlen.concat``); at least the sequence length, and the loader checks it holds
    ``global_batch / dp_size`` sequences.
    ``regroup`` (default: none, training steps are the build's steps) moves sequences between nearby steps
    of a phase for balance when each rank holds one sequence per step (:class:`Regroup`).
    """

    cost: Cost = Cost()
    micro_batches: Literal["equal", "unequal"] = "equal"
    max_tokens: Annotated[int, Field(gt=0, le=1 << 40)] | None = None
    regroup: Regroup | None = None

    @model_validator(mode="after")
    def _budget_needs_unequal(self) -> Balance:
        if self.max_tokens is not None and self.micro_batches != "unequal":
            raise ValueError("max_tokens bounds unequal micro-batches; expected micro_batches: unequal with it")
        return self
