"""mixing/mixfile/parts.py: each part of a mix file validates itself at the edge. Frozen and closed models; a
step holds at most 2^28 tokens; tokenizers, encodings and templates hold their own rules; the render fingerprint
moves with exactly the fields that decide documents.

(A phase's length, mixture and transition: test_phase.py; the balance section: test_balance.py; the mix file as a
whole, with file, line and field: test_mix.py and test_mix_fuzz.py; template and encoding refusals through a mix
file: tests/faults/test_ingest_records.py.)"""

from __future__ import annotations

import codecs
import re
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from mixing import MixError
from mixing.mixfile.balance import Balance, Cost, Regroup
from mixing.mixfile.mix import parse_mix
from mixing.mixfile.parts import (
    MAX_TOKENS_PER_STEP,
    SequenceSpec,
    SourceSpec,
    TokenizerSpec,
)
from mixing.mixfile.phase import Phase, Transition


def refusal(model: type[BaseModel], **fields: Any) -> str:
    """The messages a model's validation gives ``fields``, each one line of bounded length, joined."""
    with pytest.raises(ValidationError) as e:
        model(**fields)
    msgs = [str(err["msg"]) for err in e.value.errors()]
    assert all("\n" not in m and len(m) < 300 for m in msgs), msgs
    return " | ".join(msgs)


# --- frozen, closed models: every part, here and in phase.py and balance.py, is a FrozenModel ----------------------

EXAMPLES: list[BaseModel] = [
    TokenizerSpec(),
    SequenceSpec(length=64, global_batch=2),
    SourceSpec(uri="x"),
    Phase(phase="p", mixture={"a": 1.0}, steps=3),
    Transition(shape="linear", steps=2),
    Cost(),
    Regroup(),
    Balance(),
]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_part_is_frozen_and_refuses_unknown_fields(example: BaseModel) -> None:
    name = next(iter(type(example).model_fields))
    with pytest.raises(ValidationError):
        setattr(example, name, getattr(example, name))
    fields = example.model_dump()
    assert type(example)(**fields) == example  # a part round-trips through its fields
    with pytest.raises(ValidationError) as e:
        type(example)(**fields, unknwon=1)
    assert [err["type"] for err in e.value.errors()] == ["extra_forbidden"]


# --- sequence, tokenizer -------------------------------------------------------------------------------------------


@given(st.integers(-2, (1 << 24) + 2), st.integers(-2, (1 << 20) + 2))
def test_a_step_holds_at_most_2_to_the_28_tokens(length: int, global_batch: int) -> None:
    ok = 8 <= length <= 1 << 24 and 1 <= global_batch <= 1 << 20 and length * global_batch <= MAX_TOKENS_PER_STEP
    if ok:
        seq = SequenceSpec(length=length, global_batch=global_batch)
        assert seq.length * seq.global_batch <= MAX_TOKENS_PER_STEP
        return
    msg = refusal(SequenceSpec, length=length, global_batch=global_batch)
    if 8 <= length <= 1 << 24 and 1 <= global_batch <= 1 << 20:
        assert f"{length * global_batch:,} tokens per step" in msg


def test_a_tokenizer_names_what_it_loads() -> None:
    assert "needs 'path'" in refusal(TokenizerSpec, kind="hf", eos_token="</s>")
    assert "'eos_token'" in refusal(TokenizerSpec, kind="hf", path="tokenizer.json")
    assert "needs 'name'" in refusal(TokenizerSpec, kind="tiktoken")
    assert TokenizerSpec(kind="hf", path="t.json", eos_token="</s>").path == "t.json"
    for size in (259, (1 << 20) + 1):
        refusal(TokenizerSpec, vocab_size=size)


# --- sources -----------------------------------------------------------------------------------------------------


def test_a_source_names_its_text_one_way_and_splits_on_something() -> None:
    assert "either 'template' or 'messages'" in refusal(SourceSpec, uri="x", template="{a}", messages="m")
    assert "separator is empty" in refusal(SourceSpec, uri="x", separator="")
    for fields in ({"encoding": "latin-1"}, {"errors": "replace"}):
        assert "parquet strings are UTF-8" in refusal(SourceSpec, uri="x", format="parquet", **fields)
    assert SourceSpec(uri="x", format="parquet", encoding="UTF8").encoding == "UTF8"  # UTF-8, spelled otherwise


TEXT_CODECS = ["utf-8", "utf-8-sig", "latin-1", "cp1252", "ascii", "iso8859_15", "cp437", "koi8_r", "shift_jis", "gbk"]
NOT_ASCII = ["utf-16", "utf-16-le", "utf-32", "cp037", "cp500", "punycode"]


@pytest.mark.parametrize("encoding", TEXT_CODECS)
def test_an_ascii_compatible_encoding_cuts_records_at_newline_bytes(encoding: str) -> None:
    assert SourceSpec(uri="x", encoding=encoding).encoding == encoding
    assert b"\n".decode(encoding) == "\n" and b'{"a": "b"}\r\n'.decode(encoding) == '{"a": "b"}\r\n'


@pytest.mark.parametrize("encoding", NOT_ASCII)
def test_an_encoding_that_would_cut_records_wrongly_is_refused(encoding: str) -> None:
    assert "not ASCII-compatible" in refusal(SourceSpec, uri="x", encoding=encoding)


@pytest.mark.parametrize("encoding", ["rot13", "base64", "hex", "zlib"])
def test_a_codec_that_is_not_a_text_encoding_is_refused_in_one_line(encoding: str) -> None:
    codecs.lookup(encoding)  # a codec Python knows
    mix = f"""\
name: m
sequence: {{length: 64, global_batch: 2}}
sources:
  a: {{uri: "x/*.txt", encoding: {encoding}}}
curriculum:
  - {{phase: one, steps: 2, mixture: {{a: 1}}}}
"""
    with pytest.raises(MixError, match=r"^m\.yaml:4: sources\.a\.encoding: "):
        parse_mix(mix, "m.yaml")


TEMPLATE_TEXT = st.text(st.sampled_from(list("{}[]!:.<>^=+-_#0123456789abrsfx ")), max_size=16)


@given(TEMPLATE_TEXT)
def test_an_accepted_template_names_fields_and_indexes_only(template: str) -> None:
    try:
        spec = SourceSpec(uri="x", template=template)
    except ValidationError as e:
        (err,) = e.errors()
        assert "\n" not in err["msg"]
        return
    assert spec.template == template
    for _lit, name, fmt, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        root = name.split("[", 1)[0]
        assert root and not root.isdigit() and conversion is None
        assert re.fullmatch(r"(\[[^\]]+\])*", name[len(root) :]) and "." not in root  # indexes, no attributes
        assert "{" not in (fmt or "")  # no nested field
        for value in (1.5, 1, "x"):  # whatever the value, a field's text is short (width, precision ≤ 999)
            try:
                shown = format(value, fmt or "")
            except (ValueError, TypeError):
                continue
            assert len(shown) <= 1010


FINGERPRINTED: dict[str, Any] = {
    "format": "jsonl",
    "field": "body",
    "template": "{a}",
    "messages": "chat",
    "chat_template": "plain",
    "separator": "\n\n",
    "metadata": ("tag",),
    "extensions": (".py",),
    "max_record_bytes": 1000,
    "batch_rows": 16,
    "encoding": "latin-1",
    "errors": "replace",
}


@pytest.mark.parametrize("field", sorted(FINGERPRINTED))
def test_the_render_fingerprint_moves_with_every_field_that_decides_documents(field: str) -> None:
    base = SourceSpec(uri="data/*.jsonl")
    changed = SourceSpec(uri="data/*.jsonl", **{field: FINGERPRINTED[field]})
    assert changed.render_fingerprint() != base.render_fingerprint()
    moved = SourceSpec(uri="s3://elsewhere/*.jsonl", max_epochs=2.5, **{field: FINGERPRINTED[field]})
    assert moved.render_fingerprint() == changed.render_fingerprint()  # where the files are and how often: not


def test_every_field_but_uri_and_max_epochs_is_fingerprinted() -> None:
    assert set(SourceSpec.model_fields) - {"uri", "max_epochs"} == set(FINGERPRINTED)
