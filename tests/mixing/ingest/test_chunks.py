"""The chunk cache: keys fixed by paths, fingerprints, tokenizer and rendering; chunks reused only on equal keys."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

import mixing.ingest.chunks as chunks_module
from mixing.ingest.chunks import CHUNK_BYTES, chunk_groups, chunk_keys
from mixing.ingest.documents import open_documents, tokenize_source
from mixing.ingest.tokenizer import load_tokenizer
from mixing.mixfile.mix import SourceSpec, TokenizerSpec
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


def test_chunk_keys_name_the_chunks_a_build_writes_and_one_changed_file_changes_one_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks_module, "_GROUP", 32)  # several chunks of these 600 small files
    idx = write(tmp_path, n=600)  # boundaries hash the (temporary) paths: ~19 chunks, never fewer than 3
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


def _frame(sizes: list[int]) -> pl.DataFrame:
    return pl.DataFrame(
        {"path": [f"s3://b/part-{i:05d}.jsonl" for i in range(len(sizes))], "size": sizes, "fingerprint": "f"}
    )


def _cuts(files: pl.DataFrame, tmp_path: Path) -> list[int]:
    """The index of each chunk's first file."""
    tok = load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path)
    groups = chunk_groups(files, tok, SourceSpec(uri="x", format="jsonl"))
    starts, n = [], 0
    for group, _key in groups:
        starts.append(n)
        n += len(group)
    assert n == len(files)  # every file in exactly one chunk, in order
    return starts


def test_chunks_are_cut_by_bytes_as_well_as_files(tmp_path: Path) -> None:
    mb = 1 << 20
    group = chunks_module._GROUP
    small = _cuts(_frame([10_000] * 3000), tmp_path)  # small files: ~_GROUP a chunk
    assert 0.6 * group < 3000 / len(small) < 1.6 * group
    ones = _cuts(_frame([mb] * 3000), tmp_path)  # 1 MB files: ~CHUNK_BYTES of them, or fewer
    per_chunk = 3000 * mb / len(ones)
    assert 0.25 * CHUNK_BYTES < per_chunk < 1.2 * CHUNK_BYTES
    sizes = [mb] * 100
    sizes[10] = sizes[50] = CHUNK_BYTES  # a big file is a chunk of its own
    big = _cuts(_frame(sizes), tmp_path)
    for i in (10, 50):
        assert i in big and i + 1 in big


def test_a_files_size_moves_only_the_boundaries_beside_it(tmp_path: Path) -> None:
    sizes = [1 << 20] * 400
    before = set(_cuts(_frame(sizes), tmp_path))
    for i, size in ((100, 1), (200, 1 << 24), (300, 7 << 20)):
        changed = list(sizes)
        changed[i] = size
        after = set(_cuts(_frame(changed), tmp_path))
        assert before ^ after <= {i, i + 1}, (i, sorted(before ^ after))
