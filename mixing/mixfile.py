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
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mixing.errors import WeirError

__all__ = [
    "Cost",
    "Mix",
    "MixError",
    "Phase",
    "SequenceSpec",
    "SourceSpec",
    "TokenizerSpec",
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


class Phase(_Model):
    """A run of ``steps`` optimizer steps drawing sources in the shares of ``mixture`` (summing to 1)."""

    phase: Annotated[str, Field(pattern=_NAME)]
    steps: Annotated[int, Field(gt=0)]
    mixture: dict[str, Annotated[float, Field(ge=0)]]

    @field_validator("mixture")
    @classmethod
    def _sums_to_one(cls, v: dict[str, float]) -> dict[str, float]:
        if not v:
            raise ValueError("mixture is empty; expected at least one source with a positive weight")
        total = sum(v.values())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(f"mixture weights sum to {total:g}; expected them to sum to 1")
        return v


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
    path: str | None = Field(default=None, exclude=True)

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
        return self

    @property
    def total_steps(self) -> int:
        return sum(p.steps for p in self.curriculum)

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
