"""tokenize_source: progress events (chunk reuse and keys: test_chunks.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import polars as pl
import pytest

from mixing.ingest.documents import tokenize_source
from mixing.ingest.tokenizer import load_tokenizer
from mixing.mixfile.mix import SourceSpec, TokenizerSpec


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


def test_work_to_start_ahead_is_the_missing_chunks_largest_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mixing.ingest.chunks as chunks_module

    monkeypatch.setattr(chunks_module, "_GROUP", 16)  # several chunks of these 400 small files
    from contract.store import Store
    from mixing.engine import LOCAL
    from mixing.ingest.documents import tokenize_ahead

    idx = write(tmp_path, n=400).with_columns(size=pl.int_range(pl.len()) * 1000)
    spec, tok = SourceSpec(uri="x", format="jsonl"), load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path)
    chunks = Store(tmp_path / "out" / "chunks")
    work = tokenize_ahead(spec, idx, tok, chunks, None, LOCAL)
    sizes = [sum(r["size"] for r in g) for g, _k in work.todo]
    assert len(sizes) > 3 and sizes == sorted(sizes, reverse=True) and work.largest == sizes[0]
    assert work.reused == [] and work.submit(LOCAL) == 0  # nothing runs ahead on the local engine
    tokenize_source("s", spec, idx, tok, tmp_path / "out")
    again = tokenize_ahead(spec, idx, tok, chunks, None, LOCAL)
    assert again.todo == [] and sorted(again.reused) == sorted(k for _g, k in work.todo)
