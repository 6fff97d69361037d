"""The parts of a mix file: tokenizer, sequence, sources and continuation, and the limits every part keeps.

Frozen pydantic models (:class:`FrozenModel`: unknown fields are errors). The curriculum's phases are
:mod:`mixing.mixfile.phase`'s and the ``balance`` section is :mod:`mixing.mixfile.balance`'s;
:mod:`mixing.mixfile.mix` assembles them all into a :class:`~mixing.mixfile.mix.Mix` and maps every
validation error to the file's line and field path (:mod:`mixing.mixfile.locations`).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import re
import string
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from contract.record import FeedbackNote

__all__ = [
    "MAX_STEPS",
    "MAX_TOKENS",
    "MAX_TOKENS_PER_STEP",
    "NAME_PATTERN",
    "Continues",
    "FrozenModel",
    "SequenceSpec",
    "SourceSpec",
    "TokenizerSpec",
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
