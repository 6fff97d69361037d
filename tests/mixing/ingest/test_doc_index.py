"""A source's document index, written from its chunks one row group at a time: row groups bounded and never across
chunks, the same rows as the chunks hold whatever the row group, every offset its document's place in its chunk,
and nothing replaced when a chunk does not read back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest

import mixing.ingest.chunks as chunks_module
import mixing.ingest.doc_index as doc_index_module
from contract.store import Store
from mixing.ingest.chunks import chunk_keys
from mixing.ingest.doc_index import INDEX_SCHEMA, ChunksDamaged, write_index
from mixing.ingest.documents import open_documents, tokenize_source
from mixing.ingest.tokenizer import load_tokenizer
from mixing.mixfile.mix import SourceSpec, TokenizerSpec
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


def _corpus(root: Path) -> pl.DataFrame:
    """12 jsonl files of 1–30 records (every 7th malformed), texts of varied lengths."""
    rng = np.random.default_rng(5)
    paths = []
    for i in range(12):
        lines = []
        for j in range(int(rng.integers(1, 31))):
            if (i + j) % 7 == 3:
                lines.append('{"text": broken')
            else:
                lines.append(json.dumps({"text": "w" * int(rng.integers(1, 200)) + f" {i}.{j}"}))
        p = root / f"f{i:02d}.jsonl"
        p.write_text("\n".join(lines) + "\n")
        paths.append(str(p))
    return pl.DataFrame({"path": paths, "fingerprint": [f"fp{i}" for i in range(12)]})


@pytest.mark.parametrize("rows", [3, 7, 1 << 16])
def test_the_index_is_the_same_whatever_the_row_group_and_its_offsets_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int
) -> None:
    monkeypatch.setattr(chunks_module, "_GROUP", 4)  # a few chunks of these 12 files
    files = _corpus(tmp_path)
    spec = SourceSpec(uri="x", format="jsonl")
    tok = load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path)
    reference = tmp_path / "reference"
    tokenize_source("s", spec, files, tok, reference)
    monkeypatch.setattr(chunks_module, "INDEX_ROWS", rows)
    monkeypatch.setattr(doc_index_module, "INDEX_ROWS", rows)
    out = tmp_path / f"rows{rows}"
    report = tokenize_source("s", spec, files, tok, out)

    ds = open_documents(out)
    assert ds.docs.equals(open_documents(reference).docs)
    assert (out / "quarantine.jsonl").read_bytes() == (reference / "quarantine.jsonl").read_bytes()
    assert report.docs_seen == report.docs_kept + report.docs_quarantined and report.docs_quarantined > 0
    index = pq.ParquetFile(out / "docs.parquet")
    for g in range(index.metadata.num_row_groups):
        group = index.read_row_group(g, columns=["chunk"])["chunk"]
        assert len(group) <= rows and len(set(group.to_pylist())) == 1, "a row group of one chunk, bounded"
    for chunk in (out / "chunks").iterdir():
        meta = pq.ParquetFile(chunk / "docs.parquet").metadata
        assert all(meta.row_group(g).num_rows <= rows for g in range(meta.num_row_groups))
    for key, docs in ds.docs.group_by("chunk", maintain_order=True):
        starts = docs["offset"].to_numpy()
        lengths = docs["n_tokens"].to_numpy()
        assert starts[0] == 0 and np.array_equal(starts[1:], np.cumsum(lengths)[:-1]), key
        whole = np.fromfile(out / "chunks" / str(key[0]) / "tokens.bin", np.uint32)
        assert len(whole) == lengths.sum()
    text = {int(r["doc_id"]): r for r in ds.docs.iter_rows(named=True)}
    for doc_id in (0, len(text) // 2, len(text) - 1):  # the bytes tokenizer: a document's tokens are its bytes
        assert ds.document(doc_id).size == text[doc_id]["n_tokens"]
