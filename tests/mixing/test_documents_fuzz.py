"""Malformed records of every kind, mixed with valid ones: every record is accounted for, no valid one lost.

Three generators: jsonl lines, csv rows (invalid UTF-8 inside a quoted field, short/long rows, blank
lines), and text pieces between separators (empty pieces between two separators count as quarantined).
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixing.documents import open_documents, tokenize_source
from mixing.mixfile import SourceSpec, TokenizerSpec
from mixing.tokenizer import load_tokenizer

# pyarrow reports a malformed row whose text is not UTF-8 as an "ignored" exception (the reader then
# falls back to Python's csv); that is expected here, not a test problem.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
MAX = 2000  # max_record_bytes, small so "tens of MB" is cheap to fake
SPEC = SourceSpec(uri="unused", format="jsonl", field="text", max_record_bytes=MAX)
TOK = load_tokenizer(TokenizerSpec(kind="bytes"), Path("."))

text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=60).filter(
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


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
    assert pl.Series(ds.docs["offset"]).is_sorted()


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


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
# Texts without "-" can never make a separator with their neighbours.
piece_text = text.filter(lambda s: "-" not in s)
piece_kinds = st.one_of(
    piece_text.map(lambda t: ("ok", t.encode(), t)),
    st.sampled_from([b"", b" ", b"\n", b" \t\n "]).map(lambda b: ("empty document", b, None)),
    st.just(("invalid UTF-8", b"bad \xff piece", None)),
    st.just(("record too large", b"y" * (3 * MAX), None)),
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
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
