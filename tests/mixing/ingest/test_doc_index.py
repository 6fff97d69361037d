"""A source's document index, written from its chunks one at a time: one row group per chunk, the same rows as
the chunks hold, and nothing replaced when a chunk does not read back."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

import mixing.ingest.chunks as chunks_module
from mixing.format.store import Store
from mixing.ingest.chunks import chunk_keys
from mixing.ingest.doc_index import INDEX_SCHEMA, ChunksDamaged, write_index
from mixing.ingest.documents import tokenize_source
from mixing.ingest.tokenizer import load_tokenizer
from mixing.spec.mixfile import SourceSpec, TokenizerSpec
from tests.mixing.ingest.test_documents import write


def test_the_index_is_written_a_chunk_at_a_time_and_kept_whole_when_a_chunk_is_damaged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(chunks_module, "_GROUP", 16)  # several chunks of these 300 small files
    idx = write(tmp_path, n=300)
    spec = SourceSpec(uri="x", format="jsonl")
    tok = load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path)
    out = tmp_path / "out"
    report = tokenize_source("s", spec, idx, tok, out)
    keys = chunk_keys(idx, tok, spec)
    meta = pq.ParquetFile(out / "docs.parquet").metadata
    assert meta.num_row_groups == len(keys) == report.chunks > 3  # one chunk in memory at a time
    docs = pl.read_parquet(out / "docs.parquet")
    assert dict(docs.schema) == INDEX_SCHEMA and docs["doc_id"].to_list() == list(range(300))
    assert docs["chunk"].unique(maintain_order=True).to_list() == keys
    for key, group in docs.group_by("chunk", maintain_order=True):  # offsets run within each chunk
        assert (group["offset"] == group["n_tokens"].cum_sum() - group["n_tokens"]).all(), key

    before = {n: (out / n).read_bytes() for n in ("docs.parquet", "quarantine.jsonl")}
    chunks = Store(out / "chunks")
    for k in (keys[1], keys[-1]):
        (out / "chunks" / k / "docs.parquet").write_bytes(b"not parquet")
    with pytest.raises(ChunksDamaged) as e:
        write_index("s", keys, chunks, deep=True, tokenizer=tok.fingerprint, out=out)
    assert set(e.value.bad) == {keys[1], keys[-1]}  # every damaged chunk named, not only the first
    assert {n: (out / n).read_bytes() for n in before} == before
    assert sorted(p.name for p in out.iterdir()) == ["chunks", "docs.parquet", "quarantine.jsonl"]
