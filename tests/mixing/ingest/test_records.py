"""mixing/ingest/records.py: a record's text is rendered purely from its fields (``field``, ``template`` or
``messages``), reading only :func:`needed_fields`; every problem is a :class:`Malformed` whose reason is one of
:data:`REASONS`; a quarantined record (:func:`bad`) is one short, UTF-8-writable line; metadata JSON always
means the kept fields; the chat-marker warning names exactly the markers a tokenizer lacks.

(Reading records out of files, encodings and the byte-order mark: tests/faults/test_ingest_records.py and
test_formats.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixing.ingest.records import (
    CHAT_MARKERS,
    CHAT_TEMPLATES,
    REASONS,
    Malformed,
    bad,
    chat_markers_warning,
    has_surrogate,
    needed_fields,
    render,
)
from mixing.ingest.tokenizer import EOS, load_tokenizer, train_bpe
from mixing.mixfile.mix import SourceSpec, TokenizerSpec

SURROGATES = st.characters(categories=["Cs"])
ANY_TEXT = st.text(st.one_of(st.characters(), SURROGATES), max_size=40)  # lone surrogates too (JSON "\ud800")
NAMES = st.sampled_from(["a", "b", "c", "title", "body"])
LITERAL = st.text(st.characters(exclude_characters="{}"), max_size=6)


def spec(**fields: Any) -> SourceSpec:
    return SourceSpec(uri="unused", format="jsonl", **fields)


def malformed(rec: Any, s: SourceSpec) -> Malformed:
    with pytest.raises(Malformed) as e:
        render(rec, s)
    assert e.value.reason in REASONS and str(e.value).startswith(e.value.reason + ": "), str(e.value)
    assert "\n" not in str(e.value)
    return e.value


# --- field ---------------------------------------------------------------------------------------------------


@given(name=NAMES, text=ANY_TEXT, extra=st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
def test_a_field_is_the_text_itself_whatever_else_the_record_holds(name: str, text: str, extra: dict[str, int]) -> None:
    rec = {**extra, name: text}
    assert render(rec, spec(field=name)) == (text, None)
    assert needed_fields(spec(field=name)) == [name]


@pytest.mark.parametrize(
    ("rec", "reason", "words"),
    [
        ({}, "missing field", "'body'"),
        ({"body": None}, "missing field", "'body'"),
        ({"body": 3}, "not a string", "is a int"),
        ({"body": ["x"]}, "not a string", "is a list"),
        (["body", "x"], "not an object", "got list"),
        ("body", "not an object", "got str"),
        (None, "not an object", "got NoneType"),
    ],
)
def test_a_record_without_its_text_field_is_malformed_with_its_reason(rec: Any, reason: str, words: str) -> None:
    e = malformed(rec, spec(field="body"))
    assert e.reason == reason and words in str(e)


# --- template ------------------------------------------------------------------------------------------------


@st.composite
def templated(draw: st.DrawFn) -> tuple[str, dict[str, Any], str]:
    """A template of fields and ``[k]`` indexes, a record with extra fields, and the text it must make."""
    pieces = draw(st.lists(st.tuples(LITERAL, NAMES, st.booleans()), min_size=1, max_size=5))
    indexed = {name: ix for _lit, name, ix in pieces}  # one shape per field: the last piece's
    rec: dict[str, Any] = {f"extra{i}": draw(ANY_TEXT) for i in range(draw(st.integers(0, 3)))}
    values = {name: draw(ANY_TEXT) for name in indexed}
    for name, ix in indexed.items():
        rec[name] = {"k": values[name], "other": 1} if ix else values[name]
    template = "".join(f"{lit}{{{name}[k]}}" if indexed[name] else f"{lit}{{{name}}}" for lit, name, _ix in pieces)
    expected = "".join(f"{lit}{values[name]}" for lit, name, _ix in pieces)
    return template, rec, expected


@given(templated())
def test_a_template_renders_its_fields_and_needs_only_the_fields_it_names(
    case: tuple[str, dict[str, Any], str],
) -> None:
    template, rec, expected = case
    s = spec(template=template)
    needed = needed_fields(s)
    assert render(rec, s) == (expected, None)
    assert render({k: rec[k] for k in needed}, s) == (expected, None)  # what a columnar reader hands it
    assert len(set(needed)) == len(needed) and not any(n.startswith("extra") for n in needed)
    for name in needed:  # each named field is needed: without it, the record is malformed and says which
        e = malformed({k: v for k, v in rec.items() if k != name}, s)
        assert e.reason == "missing field" and repr(name) in str(e)


@pytest.mark.parametrize(
    ("template", "rec", "reason"),
    [
        ("{q[a]}", {"q": {"b": 1}}, "missing field"),
        ("{q[2]}", {"q": ["x"]}, "missing field"),  # an index past the list's end
        ("{n:.2f}", {"n": "text"}, "template error"),  # a format spec the value does not take
        ("{q[a]}", {"q": 5}, "template error"),  # indexing what cannot be indexed
    ],
)
def test_a_template_that_does_not_fit_the_record_is_malformed(template: str, rec: Any, reason: str) -> None:
    assert malformed(rec, spec(template=template)).reason == reason


def test_a_templates_format_spec_and_nested_indexes_apply() -> None:
    s = spec(template="{q[a][0]}|{n:>5.1f}|{m[b]}")
    assert render({"q": {"a": ["x"]}, "n": 2, "m": {"b": "y"}}, s) == ("x|  2.0|y", None)
    assert needed_fields(s) == ["q", "n", "m"]


# --- messages ------------------------------------------------------------------------------------------------

ROLES = st.sampled_from(["system", "user", "assistant", "tool"])
CONTENT = st.text(st.characters(exclude_characters="<"), max_size=20)  # no marker inside a message
CHATS = st.lists(st.tuples(ROLES, CONTENT), min_size=1, max_size=5)
PARSE = {
    "chatml": re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n", re.S),
    "llama3": re.compile(r"<\|start_header_id\|>(\w+)<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>", re.S),
}


@settings(max_examples=60)
@given(chat=CHATS, template=st.sampled_from(sorted(CHAT_TEMPLATES)))
def test_a_chat_renders_every_message_in_order_and_nothing_else(chat: list[tuple[str, str]], template: str) -> None:
    s = spec(messages="msgs", chat_template=template)
    rec = {"msgs": [{"role": r, "content": c, "name": "ignored"} for r, c in chat], "other": "x"}
    text, meta = render(rec, s)
    assert meta is None and needed_fields(s) == ["msgs"]
    assert render({"msgs": rec["msgs"]}, s) == (text, None)
    if template in PARSE:  # the markers delimit the messages exactly: the chat parses back from the text
        assert [tuple(m) for m in PARSE[template].findall(text)] == chat
        assert PARSE[template].sub("", text) == ""
        assert all(m in text for m in CHAT_MARKERS[template])
    else:  # plain: every message as "Role: content", in order
        pos = 0
        for r, c in chat:
            pos = text.index(f"{r.capitalize()}: {c}", pos)


@pytest.mark.parametrize(
    ("msgs", "reason"),
    [
        (None, "missing field"),
        ([], "invalid messages"),
        ("hello", "invalid messages"),
        ([{"role": "user"}], "invalid messages"),
        ([{"role": "user", "content": "hi"}, {"role": 1, "content": "x"}], "invalid messages"),
        ([{"role": "user", "content": "hi"}, "text"], "invalid messages"),
    ],
)
def test_messages_that_are_not_a_chat_are_malformed(msgs: Any, reason: str) -> None:
    rec = {} if msgs is None else {"chat": msgs}
    assert malformed(rec, spec(messages="chat")).reason == reason


# --- metadata ------------------------------------------------------------------------------------------------


@given(
    values=st.dictionaries(NAMES, st.one_of(ANY_TEXT, st.integers(), st.none(), st.lists(ANY_TEXT, max_size=2))),
    kept=st.lists(NAMES, min_size=1, max_size=3, unique=True),
)
def test_metadata_is_json_of_the_kept_fields_and_always_utf8(values: dict[str, Any], kept: list[str]) -> None:
    rec = {**values, "text": "t"}
    s = spec(metadata=tuple(kept))
    text, meta = render(rec, s)
    assert text == "t" and meta is not None
    meta.encode("utf-8")  # writable to parquet even when a value holds a lone surrogate
    back = json.loads(meta)
    assert list(back) == kept and back == {k: values.get(k) for k in kept}
    assert needed_fields(s) == list(dict.fromkeys(["text", *kept]))


def test_metadata_that_is_not_json_is_kept_as_its_string() -> None:
    _text, meta = render({"text": "t", "when": Path("/x"), "n": 1.5}, spec(metadata=("when", "n")))
    assert json.loads(meta or "") == {"when": "/x", "n": 1.5}


# --- quarantine records ----------------------------------------------------------------------------------------


@given(
    reason=st.sampled_from(REASONS),
    detail=ANY_TEXT,
    sample=st.one_of(st.none(), st.text(max_size=500), ANY_TEXT, st.binary(max_size=1200)),
    line=st.integers(0, 10**6),
)
def test_a_bad_record_has_its_reason_and_a_short_utf8_sample(reason: str, detail: str, sample: Any, line: int) -> None:
    r = bad("f.jsonl", line, reason, detail, sample)
    assert (r.file, r.line, r.text, r.meta) == ("f.jsonl", line, None, None)
    assert r.reason == reason and r.error is not None and r.error.startswith(f"{reason}: ")
    r.error.encode("utf-8")
    if sample is None:
        assert r.sample is None
        return
    assert r.sample is not None
    r.sample.encode("utf-8")  # the quarantine file is UTF-8
    if isinstance(sample, str) and not has_surrogate(sample):
        assert r.sample == sample[:200]
    if isinstance(sample, bytes):
        assert len(r.sample) <= 800 and r.sample == sample[:800].decode("utf-8", "replace")


def test_an_unknown_reason_is_refused() -> None:
    with pytest.raises(AssertionError):
        bad("f", 1, "no such reason", "x")


@given(ANY_TEXT)
def test_has_surrogate_is_whether_the_text_has_no_utf8_encoding(s: str) -> None:
    assert has_surrogate(s) == any(0xD800 <= ord(c) <= 0xDFFF for c in s)


# --- chat markers and the tokenizer -------------------------------------------------------------------------


def pieces_of(tok: Any) -> Any:
    """How many tokens ``tok`` makes of a text, BOS/EOS not counted (as the documents asset asks)."""
    extra = len(tok.encode_batch([""])[0])
    return lambda text: len(tok.encode_batch([text])[0]) - extra


def with_specials(folder: Path, specials: tuple[str, ...]) -> Any:
    """A real HF tokenizer with ``specials`` as special tokens (a BPE trained here, the markers added)."""
    from tokenizers import Tokenizer

    out = folder / "tokenizer.json"
    train_bpe([f"the cat {i} sat on the mat" for i in range(50)], 300, out)
    tok = Tokenizer.from_file(str(out))
    tok.add_special_tokens(list(specials))
    tok.save(str(out))
    return load_tokenizer(TokenizerSpec(kind="hf", path=str(out), eos_token=EOS), folder)


KNOWN = ("<|im_start|>", "<|eot_id|>")  # one marker of each template


@pytest.mark.parametrize("template", ["chatml", "llama3"])
@pytest.mark.parametrize("known", [KNOWN, ()])
def test_chat_markers_warning_names_exactly_the_markers_a_tokenizer_lacks(
    tmp_path: Path, template: str, known: tuple[str, ...]
) -> None:
    tok = pieces_of(with_specials(tmp_path, known))
    msg = chat_markers_warning("chat", spec(messages="m", chat_template=template), tok)
    assert msg is not None and "\n" not in msg and msg.startswith(f"source 'chat': chat_template {template!r}")
    lacking = [m for m in CHAT_MARKERS[template] if m not in known]
    assert [m for m in CHAT_MARKERS[template] if m in msg] == lacking, msg
    assert f"({tok(lacking[0])} tokens each)" in msg and tok(lacking[0]) > 1


@pytest.mark.parametrize("template", sorted(CHAT_TEMPLATES))
def test_no_chat_markers_warning_when_the_tokenizer_has_them_all(tmp_path: Path, template: str) -> None:
    tok = pieces_of(with_specials(tmp_path, CHAT_MARKERS[template]))
    assert chat_markers_warning("chat", spec(messages="m", chat_template=template), tok) is None
    raw = pieces_of(load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path))
    assert chat_markers_warning("chat", spec(field="text"), raw) is None  # no chat: nothing to warn about
