"""The mix file: the one declarative description of a build.

A mix file is YAML, read with ``yaml.safe_load`` semantics only. ``load_mix`` validates it into a frozen
:class:`Mix`; every problem raises :class:`MixError` whose message names the file, the line and the field
path (``curriculum[1].mixture.math``) and says what was expected. Loading never touches the disk beyond
reading the file.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sysconfig
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from mixing.errors import WeirError

__all__ = [
    "Cost",
    "Mix",
    "MixError",
    "Phase",
    "SequenceSpec",
    "SourceSpec",
    "TokenizerSpec",
    "Transition",
    "load_mix",
    "parse_mix",
]

_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"  # also a valid Dagster name


class MixError(WeirError, ValueError):
    """An invalid mix file. ``str(err)`` is one paragraph: ``FILE:LINE: FIELD: problem; expected ...``."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TokenizerSpec(_Model):
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
    sample_bytes: Annotated[int, Field(gt=0)] = 4_000_000
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


class SequenceSpec(_Model):
    """Packed sequence length ``length`` (S, tokens) and ``global_batch`` sequences per optimizer step."""

    length: Annotated[int, Field(ge=8, le=1 << 24)]
    global_batch: Annotated[int, Field(ge=1, le=1 << 20)]


class SourceSpec(_Model):
    """One source of documents.

    ``uri`` is a glob over any fsspec URI (local path or ``s3://``); ``{mix_dir}`` expands to the mix
    file's folder and ``{stdlib}`` to this Python's standard library folder. ``format`` says how records
    are read (``text``, ``jsonl`` incl. ``.gz``/``.zst``, ``parquet``, ``csv``, ``code``: a folder or
    ``.tar`` of source files). A record's text is ``field``, or ``template`` (a Python format string over
    the record's fields), or the chat list ``messages`` rendered by ``chat_template``. ``separator`` splits
    a text file into several documents; ``metadata`` names record fields kept with each document;
    ``extensions`` filters a code tree (default: known languages). A record whose text exceeds
    ``max_record_bytes`` is quarantined; ``batch_rows`` bounds how many rows are held in memory.
    """

    uri: str
    format: Literal["text", "jsonl", "parquet", "csv", "code"] = "text"
    field: str = "text"
    template: str | None = None
    max_epochs: Annotated[float, Field(gt=0)] = math.inf
    # Ingest options (issue 3): see mixing/formats.py and mixing/records.py for their contracts.
    messages: str | None = None
    chat_template: Literal["chatml", "plain", "llama3"] = "chatml"
    separator: str | None = None
    metadata: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()
    max_record_bytes: Annotated[int, Field(gt=0)] = 16 << 20
    batch_rows: Annotated[int, Field(gt=0)] = 4096

    @model_validator(mode="after")
    def _one_text(self) -> SourceSpec:
        if self.template is not None and self.messages is not None:
            raise ValueError("give either 'template' or 'messages', not both")
        if self.separator == "":
            raise ValueError("separator is empty; expected a non-empty string such as '\\n\\n'")
        return self

    def render_fingerprint(self) -> str:
        """sha256 of the fields that decide a file's documents (not ``uri`` nor ``max_epochs``)."""
        keep = self.model_dump(mode="json", exclude={"uri", "max_epochs"})
        return hashlib.sha256(json.dumps(keep, sort_keys=True).encode()).hexdigest()


_PERCENT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_TOKENS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMBT]?)\s*$", re.IGNORECASE)
_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def _steps_value(v: object) -> int | str | None:
    """A phase's ``steps``: a positive int or a percentage string like ``'15%'`` (no union: one message)."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        return v
    if isinstance(v, str) and (m := _PERCENT.match(v)) and 0 < float(m.group(1)) < 100:
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        raise ValueError(f"steps must be greater than 0, got {v}")
    raise ValueError(f"steps {v!r}: expected a positive integer or a percentage like '15%' (0–100)")


def _tokens_value(v: object) -> int | str | None:
    """A phase's ``tokens``: a positive int or a count string like ``'50M'`` or ``'1.5B'``."""
    if v is None or (isinstance(v, int) and not isinstance(v, bool) and v > 0):
        return v
    if isinstance(v, str) and (m := _TOKENS.match(v)) and float(m.group(1)) > 0:
        return v
    raise ValueError(f"tokens {v!r}: expected a positive integer or a count like '50M', '1.5B'")


class Transition(_Model):
    """How the mixture moves from the previous phase's to this one's over the first ``steps`` steps.

    ``step`` switches at the phase boundary (``steps`` must be 0); ``linear`` and ``cosine`` ramp over
    ``steps`` ≥ 1 steps, sampling the ramp at each step's midpoint, and reach the phase's own mixture
    exactly at step ``first_step + steps``.
    """

    shape: Literal["step", "linear", "cosine"] = "linear"
    steps: Annotated[int, Field(ge=0)] = 0

    @model_validator(mode="after")
    def _steps_match_shape(self) -> Transition:
        if self.shape == "step" and self.steps:
            raise ValueError("a 'step' transition switches at once; expected steps: 0 (or shape linear/cosine)")
        if self.shape != "step" and self.steps < 1:
            raise ValueError(f"a {self.shape!r} transition needs steps ≥ 1 (the length of the ramp)")
        return self


class Phase(_Model):
    """A run of optimizer steps drawing sources in the shares of ``mixture``.

    Its length is ``steps`` (an int, or ``"15%"`` of the whole run's steps) or ``tokens`` (an int or
    ``"50M"``-style, rounded up to whole steps of S × global_batch tokens); exactly one of the two.
    ``mixture`` weights sum to 1 unless the mix (or the phase) says ``normalize: true``.
    ``transition`` ramps in from the previous phase's mixture; ``max_doc_tokens`` draws only documents
    of at most that many tokens in this phase (the length curriculum).
    """

    phase: Annotated[str, Field(pattern=_NAME)]
    steps: Annotated[int | str | None, PlainValidator(_steps_value)] = None
    tokens: Annotated[int | str | None, PlainValidator(_tokens_value)] = None
    mixture: dict[str, Annotated[float, Field(ge=0)]]
    transition: Transition | None = None
    max_doc_tokens: Annotated[int, Field(ge=1)] | None = None
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


class Cost(_Model):
    """Cost of one document of ``l`` tokens: ``attention·l² + linear·l`` (arbitrary units)."""

    attention: Annotated[float, Field(ge=0)] = 1.0
    linear: Annotated[float, Field(ge=0)] = 8192.0

    def of(self, length: Any) -> Any:
        """Cost of documents of the given length(s); works on ints and numpy arrays alike."""
        return self.attention * length * length + self.linear * length


class Balance(_Model):
    cost: Cost = Cost()


class Mix(_Model):
    """A validated mix file. ``path`` is where it was read from (absent for in-memory mixes)."""

    name: Annotated[str, Field(pattern=_NAME)]
    seed: int = 0
    tokenizer: TokenizerSpec = TokenizerSpec()
    sequence: SequenceSpec
    sources: dict[str, SourceSpec]
    curriculum: Annotated[list[Phase], Field(min_length=1)]
    balance: Balance = Balance()
    normalize: bool = False
    path: str | None = Field(default=None, exclude=True)
    _steps: tuple[int, ...] = PrivateAttr(default=())

    @field_validator("sources")
    @classmethod
    def _source_names(cls, v: dict[str, SourceSpec]) -> dict[str, SourceSpec]:
        if not v:
            raise ValueError("no sources; expected at least one")
        for name in v:
            if not re.match(_NAME, name):
                raise ValueError(f"source name {name!r} must match {_NAME}")
        return v

    @model_validator(mode="after")
    def _cross_checks(self) -> Mix:
        seen: set[str] = set()
        for i, ph in enumerate(self.curriculum):
            if ph.phase in seen:
                raise _FieldError(("curriculum", i, "phase"), f"phase name {ph.phase!r} is used twice")
            seen.add(ph.phase)
            for src in ph.mixture:
                if src not in self.sources:
                    raise _FieldError(
                        ("curriculum", i, "mixture", src),
                        f"unknown source {src!r}; expected one of: {', '.join(sorted(self.sources))}",
                    )
            total = sum(ph.mixture.values())
            normalize = self.normalize if ph.normalize is None else ph.normalize
            if not normalize and not math.isclose(total, 1.0, abs_tol=1e-6):
                raise _FieldError(
                    ("curriculum", i, "mixture"),
                    f"mixture weights sum to {total:g}; expected them to sum to 1 (or set normalize: true "
                    "to divide them by their sum)",
                )
            if ph.transition is not None and i == 0 and ph.transition.shape != "step":
                raise _FieldError(
                    ("curriculum", 0, "transition"), "the first phase has no previous mixture to ramp from"
                )
        object.__setattr__(self, "_steps", self._resolve_steps())
        for i, (ph, n) in enumerate(zip(self.curriculum, self._steps, strict=True)):
            if ph.transition is not None and ph.transition.steps > n:
                raise _FieldError(
                    ("curriculum", i, "transition", "steps"),
                    f"the ramp is {ph.transition.steps} steps but the phase has only {n}",
                )
        return self

    def _resolve_steps(self) -> tuple[int, ...]:
        """Steps per phase: ints as given, tokens rounded up to whole steps, percentages of the whole run.

        The whole run is ``fixed / (1 - Σ percent)`` steps where ``fixed`` is the other phases' steps, so
        an ``anneal`` of ``15%`` is 15% of all steps, itself included (rounded to the nearest step, ≥ 1).
        """
        per_step = self.sequence.length * self.sequence.global_batch
        fixed = 0
        for ph in self.curriculum:
            if isinstance(ph.steps, int):
                fixed += ph.steps
            elif ph.tokens is not None:
                fixed += -(-(ph.token_count() or 0) // per_step)
        pct = [ph.percent or 0.0 for ph in self.curriculum]
        if sum(pct) > 0:
            last = max(i for i, p in enumerate(pct) if p)
            if sum(pct) >= 100:
                raise _FieldError(
                    ("curriculum", last, "steps"),
                    f"the percentages of the phases sum to {sum(pct):g}%; expected less than 100%",
                )
            if fixed == 0:
                raise _FieldError(
                    ("curriculum", last, "steps"),
                    "every phase is a percentage; expected at least one phase in steps or tokens to fix the length",
                )
        run = fixed / (1 - sum(pct) / 100)
        out = []
        for ph, p in zip(self.curriculum, pct, strict=True):
            if isinstance(ph.steps, int):
                out.append(ph.steps)
            elif ph.tokens is not None:
                out.append(-(-(ph.token_count() or 0) // per_step))
            else:
                out.append(max(1, round(run * p / 100)))
        return tuple(out)

    @property
    def phase_steps(self) -> tuple[int, ...]:
        """Resolved number of steps of each phase, in curriculum order."""
        return self._steps

    @property
    def total_steps(self) -> int:
        return sum(self._steps)

    @property
    def mix_dir(self) -> Path:
        return Path(self.path).resolve().parent if self.path else Path.cwd()

    def source_uri(self, name: str) -> str:
        """The source's glob with ``{mix_dir}`` and ``{stdlib}`` expanded."""
        return self.sources[name].uri.format(
            mix_dir=str(self.mix_dir), stdlib=sysconfig.get_paths()["stdlib"], **_env()
        )

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the validated mix (independent of formatting and comments)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


def _env() -> dict[str, str]:
    return {f"env_{k}": v for k, v in os.environ.items() if k.isidentifier()}


class _FieldError(ValueError):
    """A cross-field error that knows its field path (pydantic only knows the model's)."""

    def __init__(self, loc: tuple[str | int, ...], msg: str) -> None:
        super().__init__(msg)
        self.loc = loc
        self.msg = msg


def load_mix(path: str | os.PathLike[str]) -> Mix:
    """Read and validate the mix file at ``path``; raise :class:`MixError` naming file, line and field."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MixError(f"{p}: cannot read the mix file: {e}") from None
    return parse_mix(text, str(p))


def parse_mix(text: str, filename: str = "<mix>") -> Mix:
    """Validate mix-file ``text``; ``filename`` is used in messages and to resolve ``{mix_dir}``."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else "?"
        raise MixError(f"{filename}:{line}: YAML syntax error: {e.problem or e}; expected valid YAML") from None
    if not isinstance(data, Mapping):
        raise MixError(f"{filename}:1: the mix file must be a mapping of fields (name, sequence, ...)")
    data = dict(data)
    data.pop("path", None)
    try:
        return Mix.model_validate({**data, "path": filename})
    except ValidationError as e:
        err = e.errors()[0]
        loc, msg = tuple(err["loc"]), err["msg"]
        ctx = err.get("ctx") or {}
        if isinstance(ctx.get("error"), _FieldError):
            fe = ctx["error"]
            loc, msg = loc + fe.loc, fe.msg
        msg = msg.removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "field required but missing"
        elif err["type"] == "extra_forbidden":
            msg = "unknown field; check its spelling against the mix-file reference in README.md"
        more = f" ({len(e.errors()) - 1} more problem(s) after fixing this)" if len(e.errors()) > 1 else ""
        raise MixError(f"{filename}:{_line_of(node, loc)}: {_dotted(loc)}: {msg}.{more}") from None


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int:
    """1-based line of the deepest YAML node on ``loc`` (the parent's line when the field is missing)."""
    if node is None:
        return 1
    line = node.start_mark.line + 1
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(part):
                    child, line = v, k.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line
