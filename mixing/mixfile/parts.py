"""The parts of a mix file: tokenizer, sequence, sources, curriculum phases and the cost model.

Frozen pydantic models; unknown fields are errors. :mod:`mixing.mixfile.mix` assembles them into a
:class:`~mixing.mixfile.mix.Mix` and maps every validation error to the file's line and field path.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import re
import string
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from contract.cost import CostModel
from contract.manifest import FeedbackNote
from contract.manifest import Regroup as _Recorded

__all__ = [
    "MAX_STEPS",
    "MAX_TOKENS",
    "MAX_TOKENS_PER_STEP",
    "NAME_PATTERN",
    "Balance",
    "Continues",
    "Cost",
    "FrozenModel",
    "Phase",
    "SequenceSpec",
    "SourceSpec",
    "TokenizerSpec",
    "Transition",
]

NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"  # also a valid Dagster name
# Upper bounds that keep a valid mix buildable (the plan and the packer hold per-step arrays): far above any
# real training run (Llama 3 405B: about 1M steps of 16M tokens, 15T tokens) and far below a MemoryError.
MAX_STEPS = 10_000_000  # optimizer steps of the whole run
MAX_TOKENS_PER_STEP = 1 << 28  # sequence.length × sequence.global_batch
MAX_TOKENS = 10**16  # a phase's ``tokens``


class FrozenModel(BaseModel):
    """Base of every mix-file model: immutable, and unknown fields are errors."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class TokenizerSpec(FrozenModel):
    """How text becomes token ids.

    ``bpe`` trains a byte-level BPE of ``vocab_size`` on a sample of the mix's own sources (the default,
    because no model hub is reachable); ``hf`` loads a Hugging Face ``tokenizer.json`` from ``path``;
    ``tiktoken`` loads the encoding ``name``; ``bytes`` maps each UTF-8 byte to its value.
    """

    kind: Literal["bpe", "hf", "tiktoken", "bytes"] = "bpe"
    path: str | None = None
    name: str | None = None
    eos_token: str | None = None
    vocab_size: Annotated[int, Field(ge=260, le=1 << 20)] = 8192
    sample_bytes: Annotated[int, Field(gt=0, le=1 << 40)] = 4_000_000
    # Document boundaries: EOS is appended to every document unless ``eos: false``; ``bos: true`` also
    # prepends ``bos_token`` (default: the EOS token, as GPT-style models do).
    bos: bool = False
    eos: bool = True
    bos_token: str | None = None

    @model_validator(mode="after")
    def _needs(self) -> TokenizerSpec:
        if self.kind == "hf" and not (self.path and self.eos_token):
            raise ValueError("kind 'hf' needs 'path' (a tokenizer.json) and 'eos_token' (its end-of-text token)")
        if self.kind == "tiktoken" and not self.name:
            raise ValueError("kind 'tiktoken' needs 'name' (for example o200k_base)")
        return self


class SequenceSpec(FrozenModel):
    """Packed sequence length ``length`` (S, tokens) and ``global_batch`` sequences per optimizer step."""

    length: Annotated[int, Field(ge=8, le=1 << 24)]
    global_batch: Annotated[int, Field(ge=1, le=1 << 20)]

    @model_validator(mode="after")
    def _step_fits(self) -> SequenceSpec:
        if self.length * self.global_batch > MAX_TOKENS_PER_STEP:
            raise ValueError(
                f"length × global_batch = {self.length * self.global_batch:,} tokens per step; expected at most "
                f"{MAX_TOKENS_PER_STEP:,} (2^28)"
            )
        return self


class SourceSpec(FrozenModel):
    """One source of documents.

    ``uri`` is a glob over any fsspec URI (local path or ``s3://``); ``{mix_dir}`` expands to the mix
    file's folder and ``{stdlib}`` to this Python's standard library folder. ``format`` says how records
    are read (``text``, ``jsonl`` incl. ``.gz``/``.zst``, ``parquet``, ``csv``, ``code``: a folder or
    ``.tar`` of source files). A record's text is ``field``, or ``template`` (a Python format string over
    the record's fields), or the chat list ``messages`` rendered by ``chat_template``. ``separator`` splits
    a text file into several documents; ``metadata`` names record fields kept with each document;
    ``extensions`` filters a code tree (default: known languages). A record whose text exceeds
    ``max_record_bytes`` is quarantined; ``batch_rows`` bounds how many rows are held in memory.

    ``encoding`` (text, code, csv, jsonl; any ASCII-compatible Python codec such as ``latin-1`` or
    ``cp1252``) decodes the files; ``errors: strict`` (default) quarantines a record that does not
    decode, ``replace`` keeps it with U+FFFD, ``ignore`` drops the bad bytes. A UTF-8 byte-order mark at
    the start of a file is skipped. A ``template`` may only name fields and index them (``{a}``,
    ``{a[b]}``, ``{a[0]}``) with an optional standard format spec (``{score:.2f}``, width and precision
    at most 3 digits): no attribute access, no ``!r``/``!s``/``!a`` conversion, no nested fields.
    """

    uri: str
    format: Literal["text", "jsonl", "parquet", "csv", "code"] = "text"
    field: str = "text"
    template: str | None = None
    max_epochs: Annotated[float, Field(gt=0)] = math.inf
    # Ingest options: see mixing/ingest/formats.py and mixing/ingest/records.py for their contracts.
    messages: str | None = None
    chat_template: Literal["chatml", "plain", "llama3"] = "chatml"
    separator: str | None = None
    metadata: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()
    max_record_bytes: Annotated[int, Field(gt=0)] = 16 << 20
    batch_rows: Annotated[int, Field(gt=0)] = 4096
    encoding: str = "utf-8"
    errors: Literal["strict", "replace", "ignore"] = "strict"

    @model_validator(mode="after")
    def _one_text(self) -> SourceSpec:
        if self.template is not None and self.messages is not None:
            raise ValueError("give either 'template' or 'messages', not both")
        if self.separator == "":
            raise ValueError("separator is empty; expected a non-empty string such as '\\n\\n'")
        if self.format == "parquet" and (codecs.lookup(self.encoding).name != "utf-8" or self.errors != "strict"):
            raise ValueError("parquet strings are UTF-8; 'encoding' and 'errors' apply to text, code, csv, jsonl")
        return self

    @field_validator("encoding")
    @classmethod
    def _ascii_compatible(cls, v: str) -> str:
        try:
            codecs.lookup(v)
        except LookupError:
            raise ValueError(f"unknown encoding {v!r}; expected a Python codec such as 'utf-8' or 'latin-1'") from None
        probe = '\n\r\t ,"{}[]:azAZ09'
        if codecs.lookup(v).name == "utf-8-sig":  # UTF-8 (a leading BOM is skipped in any case)
            return v
        try:
            ok = probe.encode(v) == probe.encode("ascii") and b"\n".decode(v) == "\n"
        except (UnicodeError, ValueError, LookupError):  # LookupError: a codec that is not a text encoding (rot13)
            ok = False
        if not ok:  # records are cut at newline bytes before decoding
            raise ValueError(
                f"encoding {v!r} is not ASCII-compatible; expected one such as 'utf-8', 'latin-1', 'cp1252'"
            )
        return v

    @field_validator("template")
    @classmethod
    def _fields_only(cls, v: str | None) -> str | None:
        if v is not None:
            _check_template(v)
        return v

    def render_fingerprint(self) -> str:
        """sha256 of the fields that decide a file's documents (not ``uri`` nor ``max_epochs``)."""
        keep = self.model_dump(mode="json", exclude={"uri", "max_epochs"})
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


# A template's replacement field: a field name, then ``[key]`` indexes; and the standard format spec.
_FIELD = re.compile(r"^[^.\[\]]+(\[[^\]]+\])*$")
_FORMAT_SPEC = re.compile(r"^(?:.?[<>=^])?[-+ ]?z?#?0?\d{0,3}[,_]?(?:\.\d{1,3})?[bcdeEfFgGnosxX%]?$")


def _check_template(template: str) -> None:
    """Raise ValueError unless every replacement field of ``template`` is a field with ``[key]`` indexes."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"template {template!r}: {e}; write a literal brace as {{{{ or }}}}") from None
    for _lit, name, spec, conversion in parts:
        if name is None:
            continue
        shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
        if not name or name.isdigit():
            raise ValueError(f"template field {shown} has no name; expected a record field such as {{text}}")
        if not _FIELD.match(name):
            raise ValueError(
                f"template field {shown}: only field names and [key] indexes are allowed (no attribute access)"
            )
        if conversion:
            raise ValueError(f"template field {shown}: conversions (!r, !s, !a) are not allowed")
        if spec and ("{" in spec or not _FORMAT_SPEC.match(spec)):
            raise ValueError(
                f"template field {shown}: format spec {spec!r} is not allowed; expected a standard one "
                "such as '.2f' or '>10' (width and precision of at most 3 digits, no nested fields)"
            )


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


class Continues(FrozenModel):
    """A continuation (``weir build NEW --continue BASE --at N``): steps before ``at`` are those of the build
    at ``base`` (a build folder or an fsspec root, taken relative to the mix file like every path), byte for
    byte; from ``at`` on the build follows this mix file. :mod:`mixing.continuation` checks that nothing of this
    mix would have changed the steps before ``at``."""

    base: Annotated[str, Field(min_length=1)]
    at: Annotated[int, Field(ge=1, le=MAX_STEPS)]
    feedback: FeedbackNote | None = None  # set by mixing.feedback.apply_feedback, never written in a mix file

    @field_validator("feedback", mode="before")
    @classmethod
    def _not_in_a_file(cls, v: object) -> object:
        if v is not None:
            raise ValueError("feedback comes from weir build --feedback LOSSES --policy NAME, not from a mix file")
        return v
