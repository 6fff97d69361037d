"""Malformed records of every kind, mixed with valid ones: every record is accounted for, no valid one lost.

Three generators: jsonl lines, csv rows (invalid UTF-8 inside a quoted field, short/long rows, blank
lines), and text pieces between separators (empty pieces between two separators count as quarantined).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import tempfile
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixing.ingest.documents import open_documents, tokenize_source
from mixing.ingest.records import REASONS
from mixing.ingest.tokenizer import TextTokenizer, load_tokenizer, train_bpe
from mixing.mixfile.mix import SourceSpec, TokenizerSpec

# pyarrow reports a malformed row whose text is not UTF-8 as an "ignored" exception (the reader then
# falls back to Python's csv); that is expected here, not a test problem.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
MAX = 2000  # max_record_bytes, small so "tens of MB" is cheap to fake
SPEC = SourceSpec(uri="unused", format="jsonl", field="text", max_record_bytes=MAX)
TOK = load_tokenizer(TokenizerSpec(kind="bytes"), Path("."))

text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=60).filter(
    lambda s: s.strip() != ""
)
# (kind, raw line) where kind is the expected reason, or "ok" with its text.
kinds = st.one_of(
    text.map(lambda t: ("ok", json.dumps({"text": t}).encode(), t)),
    st.just(("invalid JSON", b'{"text": "unterminated', None)),
    st.just(("invalid UTF-8", b'{"text": "\xff\xfe"}', None)),
    st.just(("missing field", b'{"other": "x"}', None)),
    st.just(("not a string", b'{"text": 42}', None)),
    st.just(("not an object", b'["text"]', None)),
    st.just(("empty document", b'{"text": "   "}', None)),
    st.just(("record too large", json.dumps({"text": "y" * (3 * MAX)}).encode(), None)),
)


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(files=st.lists(st.lists(kinds, max_size=25), min_size=1, max_size=4), missing=st.booleans())
def test_counts_identity_and_nothing_valid_lost(tmp_path_factory, files, missing) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("fuzz")
    paths = []
    for i, recs in enumerate(files):
        p = root / f"f{i}.jsonl"
        p.write_bytes(b"".join(raw + b"\n" for _k, raw, _t in recs))
        paths.append(str(p))
    if missing:
        paths.append(str(root / "missing.jsonl"))  # unreadable: one quarantined record
    r = tokenize_source("s", SPEC, sorted(paths), TOK, root / "out")

    expected_ok = [t for recs in files for k, _r, t in recs if k == "ok"]
    expected_bad = [k for recs in files for k, _r, _t in recs if k != "ok"] + (["unreadable file"] if missing else [])
    _check(r, root / "out", expected_ok, expected_bad)


def _check(r, out: Path, expected_ok: list[str], expected_bad: list[str]) -> None:  # type: ignore[no-untyped-def]
    """The counts identity, the reasons counted, and every valid text kept, in order, byte for byte."""
    assert r.docs_seen == r.docs_kept + r.docs_quarantined
    assert r.docs_kept == len(expected_ok)
    assert r.docs_quarantined == len(expected_bad)
    assert r.quarantine_reasons == {k: expected_bad.count(k) for k in set(expected_bad)}

    ds = open_documents(out)
    got = [bytes(ds.document(i)[:-1].astype(np.uint8)).decode() for i in range(len(ds.docs))]
    assert got == expected_ok
    assert (ds.document(0)[-1:] == 256).all() if got else True
    q = [json.loads(x) for x in (out / "quarantine.jsonl").read_bytes().split(b"\n") if x]  # not splitlines: U+0085
    assert len(q) == r.docs_quarantined and all(x["file"] and x["reason"] for x in q)
    assert ds.docs["tokenizer"].unique().to_list() in ([TOK.fingerprint], [])
    # each chunk's documents are back to back in its tokens, and the chunks follow one another
    assert len(ds.docs["chunk"].rle()) == ds.docs["chunk"].n_unique()
    starts = ds.docs.group_by("chunk", maintain_order=True).agg(pl.col("offset"), pl.col("n_tokens"))
    for offsets, lengths in starts.select("offset", "n_tokens").iter_rows():
        assert offsets == [sum(lengths[:i]) for i in range(len(lengths))]


def _csv_row(*fields: str) -> bytes:
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerow(fields)
    return buf.getvalue().encode()


# csv rows of a ``text,n`` file: (expected kind, raw row bytes, text when ok).
csv_kinds = st.one_of(
    text.map(lambda t: ("ok", _csv_row(t, "1"), t)),
    text.map(lambda t: ("invalid UTF-8", b'"' + t.encode().replace(b'"', b'""') + b'\xff\xfe","1"\n', None)),
    st.just(("invalid CSV row", b'"\xff\xfe",0","1"\n', None)),  # malformed and not UTF-8 either
    st.just(("invalid UTF-8", b'"\xc3(",2\n', None)),
    st.just(("invalid CSV row", b'"a","b","c"\n', None)),
    st.just(("empty document", b'"  ",3\n', None)),
    st.just(("empty document", b"\n", None)),  # a blank line is a row with an empty text
    st.just(("record too large", _csv_row("y" * (3 * MAX), "4"), None)),
)


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(files=st.lists(st.lists(csv_kinds, max_size=25), min_size=1, max_size=3))
def test_csv_counts_identity_and_nothing_valid_lost(tmp_path_factory, files) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("fuzzcsv")
    paths = []
    for i, rows in enumerate(files):
        p = root / f"f{i}.csv"
        p.write_bytes(b"text,n\n" + b"".join(raw for _k, raw, _t in rows))
        paths.append(str(p))
    spec = SourceSpec(uri="unused", format="csv", field="text", max_record_bytes=MAX)
    r = tokenize_source("s", spec, paths, TOK, root / "out")
    expected_ok = [t for rows in files for k, _r, t in rows if k == "ok"]
    _check(r, root / "out", expected_ok, [k for rows in files for k, _r, _t in rows if k != "ok"])


SEP = "\n---\n"
# Texts without "-" can never make a separator with their neighbours; nor can one that does not end in "\r" (the
# separator's "\n" matches any line end, so a piece's last "\r" before it would make a "\r\n").
piece_text = text.filter(lambda s: "-" not in s and not s.endswith("\r"))
piece_kinds = st.one_of(
    piece_text.map(lambda t: ("ok", t.encode(), t)),
    st.sampled_from([b"", b" ", b"\n", b" \t\n "]).map(lambda b: ("empty document", b, None)),
    st.just(("invalid UTF-8", b"bad \xff piece", None)),
    st.just(("record too large", b"y" * (3 * MAX), None)),
)


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(files=st.lists(st.tuples(st.lists(piece_kinds, min_size=1, max_size=20), st.booleans()), min_size=1, max_size=3))
def test_separator_counts_identity_and_nothing_valid_lost(tmp_path_factory, files) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("fuzztxt")
    paths, expected = [], []
    for i, (pieces, trailing) in enumerate(files):
        p = root / f"f{i}.txt"
        p.write_bytes(SEP.encode().join(raw for _k, raw, _t in pieces) + (SEP.encode() if trailing else b""))
        paths.append(str(p))
        # A blank tail after the last separator ends the file rather than being a piece.
        expected += pieces if trailing or pieces[-1][0] != "empty document" else pieces[:-1]
    spec = SourceSpec(uri="unused", format="text", separator=SEP, max_record_bytes=MAX)
    r = tokenize_source("s", spec, paths, TOK, root / "out")
    _check(r, root / "out", [t for k, _r, t in expected if k == "ok"], [k for k, _r, _t in expected if k != "ok"])


# Poison records: arbitrary JSON values, strings with lone surrogates and control
# characters, arbitrary bytes, JSON nested far deeper than Python's recursion limit, a leading BOM. One
# record's content never fails the build; every non-blank line is one record, kept or quarantined.
poison_chars = st.one_of(
    st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),  # lone surrogates ("\ud800" escapes)
    st.characters(max_codepoint=0x1F),  # control characters, NUL included
    st.characters(),
)
poison_text = st.text(poison_chars, max_size=20)
json_value = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | poison_text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(poison_text, inner, max_size=3),
    max_leaves=8,
)


def _json_line(value: object, ascii_only: bool) -> bytes:
    # ensure_ascii=False with a surrogate makes bytes that are not UTF-8 (as some tools write them)
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def _kept_text(value: object) -> str | None:
    """The document a ``{"text": ...}`` record must become, or None when it must be quarantined."""
    t = value.get("text") if isinstance(value, dict) else None
    if not isinstance(t, str) or not t.strip() or any("\ud800" <= c <= "\udfff" for c in t):
        return None
    return t


poison_lines = st.one_of(
    st.tuples(st.fixed_dictionaries({"text": poison_text}, optional={"x": json_value}), st.booleans()).map(
        lambda v: (_json_line(*v), _kept_text(v[0]) if v[1] else None)
    ),
    st.tuples(json_value, st.booleans()).map(lambda v: (_json_line(*v), _kept_text(v[0]) if v[1] else None)),
    st.binary(max_size=40).map(lambda b: (b.replace(b"\n", b" ").replace(b"\r", b" "), None)),  # one line each
    st.integers(1_000, 100_000).map(lambda d: (b'{"text": ' + b"[" * d + b"]" * d + b"}", None)),
    st.integers(1_000, 100_000).map(lambda d: (b"[" * d + b"]" * d, None)),
)


@functools.cache
def _tokenizers() -> dict[str, TextTokenizer]:
    out = Path(tempfile.mkdtemp(prefix="weir-bpe-"))
    train_bpe(['poison records never stop the build. 0123456789 {}[]"' * 20], 300, out / "tokenizer.json")
    return {"bytes": TOK, "bpe": load_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), out)}


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(
    files=st.lists(st.lists(poison_lines, max_size=12), min_size=1, max_size=3),
    bom=st.booleans(),
    kind=st.sampled_from(["bytes", "bpe"]),
)
def test_poison_records_are_quarantined_never_fatal(tmp_path_factory, files, bom, kind) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("poison")
    paths, lines = [], 0
    for i, recs in enumerate(files):
        content = (b"\xef\xbb\xbf" if bom else b"") + b"".join(raw + b"\n" for raw, _t in recs)
        (root / f"f{i}.jsonl").write_bytes(content)
        paths.append(str(root / f"f{i}.jsonl"))
        lines += sum(1 for raw, _t in recs if raw.strip())
    spec = SourceSpec(uri="unused", format="jsonl", field="text", metadata=("x",))
    r = tokenize_source("s", spec, paths, _tokenizers()[kind], root / "out")

    assert r.docs_seen == r.docs_kept + r.docs_quarantined == lines
    q = [x for x in (root / "out" / "quarantine.jsonl").read_bytes().split(b"\n") if x]
    assert len(q) == r.docs_quarantined and all(json.loads(x)["reason"] for x in q)
    assert set(r.quarantine_reasons) <= set(REASONS)
    if kind == "bytes":  # every kept document is valid text, and every well-formed record is among them
        ds = open_documents(root / "out")
        got = iter([bytes(ds.document(i)[:-1].astype(np.uint8)).decode("utf-8") for i in range(len(ds.docs))])
        assert all(t in got for recs in files for _raw, t in recs if t is not None)  # in order
