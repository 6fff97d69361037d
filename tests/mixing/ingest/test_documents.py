"""tokenize_source: progress events (chunk reuse and keys: test_chunks.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import polars as pl
import pytest

from mixing.ingest.documents import tokenize_source
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
