"""A curriculum phase of a mix file: its mixture, its length, the ramp into it, and its length in steps.

Frozen pydantic models (unknown fields are errors). A :class:`Phase`'s length is exactly one of ``steps`` (a
positive int, or a percentage ``'15%'`` of the whole run) and ``tokens`` (a positive int, or a count ``'50M'``,
``'1.5B'``), within :data:`~mixing.mixfile.parts.MAX_STEPS` and :data:`~mixing.mixfile.parts.MAX_TOKENS`; a
refused value's message is one short line whatever the value. :func:`resolve_steps` turns a curriculum's
lengths into whole optimizer steps, deterministically (integer arithmetic but for the percentages' rounding),
raising :class:`~mixing.mixfile.locations.FieldError` at the phase whose length cannot be resolved.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated, Literal

from pydantic import (
    Field,
    PlainValidator,
    field_validator,
    model_validator,
)

from mixing.mixfile.balance import Regroup
from mixing.mixfile.locations import FieldError
from mixing.mixfile.parts import MAX_STEPS, MAX_TOKENS, NAME_PATTERN, FrozenModel, SequenceSpec

__all__ = ["Phase", "Transition", "resolve_steps"]

_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_TOKENS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMBT]?)\s*$", re.IGNORECASE)
_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def _steps_value(v: object) -> int | str | None:
    """A phase's ``steps``: a positive int or a percentage string like ``'15%'`` (no union: one message)."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_STEPS):
        return v
    if isinstance(v, str) and (m := _PERCENT.match(v)) and 0 < float(m.group(1)) < 100:
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        if v > MAX_STEPS:
            raise ValueError(f"{_big(v)} steps is more than the limit of {MAX_STEPS:,} steps per run")
        raise ValueError(f"steps must be greater than 0, got {v}")
    raise ValueError(f"steps {_short(v)}: expected a positive integer or a percentage like '15%' (0–100)")


def _tokens_value(v: object) -> int | str | None:
    """A phase's ``tokens``: a positive int or a count string like ``'50M'`` or ``'1.5B'``."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 < v <= MAX_TOKENS):
        return v
    if isinstance(v, str) and (m := _TOKENS.match(v)) and (n := float(m.group(1)) * _SUFFIX[m.group(2).upper()]) > 0:
        if n <= MAX_TOKENS:
            return v
        raise ValueError(f"tokens {_short(v)} is more than the limit of {MAX_TOKENS:.0e} tokens per phase")
    if isinstance(v, int) and not isinstance(v, bool) and v > MAX_TOKENS:
        raise ValueError(f"tokens {_big(v)} is more than the limit of {MAX_TOKENS:.0e} tokens per phase")
    raise ValueError(f"tokens {_short(v)}: expected a positive integer or a count like '50M', '1.5B'")


def _big(n: int) -> str:
    """A huge int for a message: its digits up to 20, else its order of magnitude."""
    return f"{n:,}" if n < 10**20 else f"about 10^{len(str(n)) - 1}"


def _short(v: object) -> str:
    """``repr(v)`` cut to 60 characters (a message stays one short line whatever the file holds)."""
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


class Transition(FrozenModel):
    """How the mixture moves from the previous phase's to this one's over the first ``steps`` steps.

    ``step`` switches at the phase boundary (``steps`` must be 0); ``linear`` and ``cosine`` ramp over
    ``steps`` ≥ 1 steps, sampling the ramp at each step's midpoint, and reach the phase's own mixture
    exactly at step ``first_step + steps``.
    """

    shape: Literal["step", "linear", "cosine"] = "linear"
    steps: Annotated[int, Field(ge=0, le=MAX_STEPS)] = 0

    @model_validator(mode="after")
    def _steps_match_shape(self) -> Transition:
        if self.shape == "step" and self.steps:
            raise ValueError("a 'step' transition switches at once; expected steps: 0 (or shape linear/cosine)")
        if self.shape != "step" and self.steps < 1:
            raise ValueError(f"a {self.shape!r} transition needs steps ≥ 1 (the length of the ramp)")
        return self


class Phase(FrozenModel):
    """A run of optimizer steps drawing sources in the shares of ``mixture``.

    Its length is ``steps`` (an int, or ``"15%"`` of the whole run's steps) or ``tokens`` (an int or
    ``"50M"``-style, rounded up to whole steps of S × global_batch tokens); exactly one of the two.
    ``mixture`` weights sum to 1 unless the mix (or the phase) says ``normalize: true``.
    ``transition`` ramps in from the previous phase's mixture; ``max_doc_tokens`` draws only documents
    of at most that many tokens in this phase (the length curriculum).
    """

    phase: Annotated[str, Field(pattern=NAME_PATTERN)]
    steps: Annotated[int | str | None, PlainValidator(_steps_value)] = None
    tokens: Annotated[int | str | None, PlainValidator(_tokens_value)] = None
    mixture: dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]]
    transition: Transition | None = None
    max_doc_tokens: Annotated[int, Field(ge=1, le=1 << 40)] | None = None
    normalize: bool | None = None

    @field_validator("mixture")
    @classmethod
    def _not_empty(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("mixture is empty; expected at least one source with a positive weight")
        if sum(v.values()) <= 0:
            raise ValueError("mixture weights are all 0; expected at least one positive weight")
        return v

    @model_validator(mode="after")
    def _one_length(self) -> Phase:
        if (self.steps is None) == (self.tokens is None):
            raise ValueError("give the phase's length as exactly one of 'steps' or 'tokens'")
        return self

    @property
    def shares(self) -> dict[str, float]:
        """The mixture's weights divided by their sum (the same values when they already sum to 1)."""
        total = sum(self.mixture.values())
        return {k: v / total for k, v in self.mixture.items()}

    @property
    def percent(self) -> float | None:
        """The phase's share of the run in percent when ``steps`` is a percentage, else None."""
        return float(_PERCENT.match(self.steps).group(1)) if isinstance(self.steps, str) else None  # type: ignore[union-attr]

    def token_count(self) -> int | None:
        """``tokens`` as an int (suffixes K/M/B/T expanded), or None when the phase is given in steps."""
        if self.tokens is None or isinstance(self.tokens, int):
            return self.tokens
        m = _TOKENS.match(self.tokens)
        assert m is not None
        return round(float(m.group(1)) * _SUFFIX[m.group(2).upper()])


def resolve_steps(curriculum: Sequence[Phase], sequence: SequenceSpec, regroup: Regroup | None) -> tuple[int, ...]:
    """Steps per phase of ``curriculum``: ints as given, tokens rounded up to whole steps of ``sequence.length ×
    sequence.global_batch`` tokens, percentages of the whole run; with ``regroup``, whole blocks of its ``period``.

    The whole run is ``fixed / (1 - Σ percent)`` steps where ``fixed`` is the other phases' steps, so
    an ``anneal`` of ``15%`` is 15% of all steps, itself included (rounded to the nearest step, ≥ 1).
    """
    per_step = sequence.length * sequence.global_batch
    fixed = 0
    for ph in curriculum:
        if isinstance(ph.steps, int):
            fixed += ph.steps
        elif ph.tokens is not None:
            fixed += -(-(ph.token_count() or 0) // per_step)
    pct = [ph.percent or 0.0 for ph in curriculum]
    if sum(pct) > 0:
        last = max(i for i, p in enumerate(pct) if p)
        if sum(pct) >= 100:
            raise FieldError(
                ("curriculum", last, "steps"),
                f"the percentages of the phases sum to {sum(pct):g}%; expected less than 100%",
            )
        if fixed == 0:
            raise FieldError(
                ("curriculum", last, "steps"),
                "every phase is a percentage; expected at least one phase in steps or tokens to fix the length",
            )
    run = fixed / (1 - sum(pct) / 100)
    # with regrouping, every phase is a whole number of template blocks: tokens round up, percentages
    # to the nearest block, and steps given as such must already be a multiple
    block = regroup.period if regroup else 1
    out = []
    for i, (ph, p) in enumerate(zip(curriculum, pct, strict=True)):
        if isinstance(ph.steps, int):
            if ph.steps % block:
                lower, upper = ph.steps - ph.steps % block, ph.steps - ph.steps % block + block
                raise FieldError(
                    ("curriculum", i, "steps"),
                    f"{ph.steps} steps is not a multiple of balance.regroup.period {block}; expected "
                    f"{' or '.join(str(n) for n in (lower, upper) if n > 0)}",
                )
            out.append(ph.steps)
        elif ph.tokens is not None:
            out.append(-(-(ph.token_count() or 0) // (per_step * block)) * block)
        else:
            out.append(max(1, round(run * p / 100 / block)) * block)
    return tuple(out)
