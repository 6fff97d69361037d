"""The chunk cache: keys fixed by paths, fingerprints, tokenizer and rendering; chunks reused only on equal keys."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from mixing.ingest.chunks import chunk_keys
from mixing.ingest.documents import open_documents, tokenize_source
from mixing.ingest.tokenizer import load_tokenizer
from mixing.spec.mixfile import SourceSpec, TokenizerSpec
from tests.mixing.ingest.test_documents import write


def test_chunks_are_reused_only_for_the_same_tokenizer(tmp_path: Path) -> None:
    idx = write(tmp_path)
    spec = SourceSpec(uri="x", format="jsonl", metadata=("tag",))
    plain = load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path)
    bos = load_tokenizer(TokenizerSpec(kind="bytes", bos=True), tmp_path)
    first = tokenize_source("s", spec, idx, plain, tmp_path / "out")
    again = tokenize_source("s", spec, idx, plain, tmp_path / "out")
    assert first.chunks_reused == 0 and again.chunks_reused == again.chunks == first.chunks
    other = tokenize_source("s", spec, idx, bos, tmp_path / "out")
    assert other.chunks_reused == 0 and other.tokens == first.tokens + 40
    docs = open_documents(tmp_path / "out").docs
    assert docs["tokenizer"].unique().to_list() == [bos.fingerprint]
    assert [json.loads(m)["tag"] for m in docs["meta"]] == list(range(40))
    assert len(list((tmp_path / "out" / "chunks").iterdir())) == other.chunks  # stale chunks removed


def test_chunk_keys_name_the_chunks_a_build_writes_and_one_changed_file_changes_one_key(tmp_path: Path) -> None:
    idx = write(tmp_path, n=200)
    spec = SourceSpec(uri="x", format="jsonl")
    tok = load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path)
    keys = chunk_keys(idx, tok, spec)
    assert len(keys) > 2 and chunk_keys(idx, tok, spec) == keys  # deterministic
    tokenize_source("s", spec, idx, tok, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out" / "chunks").iterdir()) == sorted(keys)

    changed = idx.with_columns(
        pl.when(pl.int_range(pl.len()) == 100).then(pl.lit("edited")).otherwise("fingerprint").alias("fingerprint")
    )
    after = chunk_keys(changed, tok, spec)
    assert len(after) == len(keys) and sum(a != b for a, b in zip(after, keys, strict=True)) == 1
    rendered = SourceSpec(uri="x", format="jsonl", metadata=("tag",))
    assert not set(chunk_keys(idx, tok, rendered)) & set(keys)  # the rendering is part of every key
    unknown = idx.with_columns(
        pl.when(pl.int_range(pl.len()) == 100).then(None).otherwise("fingerprint").alias("fingerprint")
    )
    first, second = chunk_keys(unknown, tok, spec), chunk_keys(unknown, tok, spec)
    assert sum(a != b for a, b in zip(first, second, strict=True)) == 1  # no fingerprint: never reused
