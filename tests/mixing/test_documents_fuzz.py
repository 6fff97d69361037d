"""Malformed records of every kind, mixed with valid ones: every record is accounted for, no valid one lost."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mixing.documents import open_documents, tokenize_source
from mixing.mixfile import SourceSpec, TokenizerSpec
from mixing.tokenizer import load_tokenizer

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
    assert r.docs_seen == r.docs_kept + r.docs_quarantined
    assert r.docs_kept == len(expected_ok)
    assert r.docs_quarantined == len(expected_bad)
    assert r.quarantine_reasons == {k: expected_bad.count(k) for k in set(expected_bad)}

    ds = open_documents(root / "out")
    got = [bytes(ds.document(i)[:-1].astype(np.uint8)).decode() for i in range(len(ds.docs))]
    assert got == expected_ok
    assert (ds.document(0)[-1:] == 256).all() if got else True
    q = [json.loads(x) for x in (root / "out" / "quarantine.jsonl").read_text().splitlines()]
    assert len(q) == r.docs_quarantined and all(x["file"] and x["reason"] for x in q)
    assert ds.docs["tokenizer"].unique().to_list() in ([TOK.fingerprint], [])
    assert pl.Series(ds.docs["offset"]).is_sorted()
