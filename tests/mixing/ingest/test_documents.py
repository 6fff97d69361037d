"""tokenize_source: progress events, chunk reuse keyed by tokenizer, metadata columns."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import polars as pl
import pytest

from mixing.ingest.documents import open_documents, tokenize_source
from mixing.ingest.tokenizer import load_tokenizer
from mixing.spec.mixfile import SourceSpec, TokenizerSpec


def write(root: Path, n: int = 40) -> pl.DataFrame:
    paths = []
    for i in range(n):
        p = root / f"f{i:03d}.jsonl"
        p.write_text(json.dumps({"text": f"document {i}", "tag": i}) + "\n")
        paths.append(str(p))
    return pl.DataFrame({"path": paths, "fingerprint": [f"fp{i}" for i in range(n)]})


def test_progress_reports_files_documents_and_rate(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    idx = write(tmp_path)
    lines: list[str] = []
    tok = load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path)
    with caplog.at_level(logging.INFO, logger="weir.progress"):
        tokenize_source("s", SourceSpec(uri="x", format="jsonl"), idx, tok, tmp_path / "out", lines.append)
    assert lines and lines[-1].startswith("s: 40/40 files, 40 documents") and "MB/s" in lines[-1]
    events = [r.progress for r in caplog.records if hasattr(r, "progress")]  # type: ignore[attr-defined]
    assert events[-1].files_done == events[-1].files == 40


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
