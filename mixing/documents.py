"""Tokenized documents of one source: metadata as parquet, token ids as one flat binary file.

Per source folder: ``docs.parquet`` (``doc_id`` int64 0..n-1 in file/record order, ``source``, ``file``,
``line``, ``n_tokens`` int64, ``offset`` int64 into the token file), ``tokens.bin`` (little-endian uint32
token ids, documents back to back, each ending in EOS) and ``quarantine.jsonl`` (one line per malformed
record: file, line, reason). All three are written to temporary names and renamed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from mixing.layout import atomic_path
from mixing.mixfile import SourceSpec
from mixing.sources import Record, read_records
from mixing.tokenizer import TextTokenizer

__all__ = ["DocumentSet", "TokenizeReport", "open_documents", "tokenize_source"]

_BATCH_BYTES = 1 << 20


@dataclass(frozen=True)
class TokenizeReport:
    """What tokenizing one source saw: ``docs_seen == docs_kept + docs_quarantined``."""

    docs_seen: int
    docs_kept: int
    docs_quarantined: int
    tokens: int
    bytes_in: int
    quarantine_reasons: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DocumentSet:
    """A tokenized source opened for reading; ``tokens`` is a read-only uint32 memory map."""

    docs: pl.DataFrame
    tokens: np.ndarray

    def document(self, doc_id: int) -> np.ndarray:
        row = self.docs.row(doc_id, named=True)
        return self.tokens[row["offset"] : row["offset"] + row["n_tokens"]]


def open_documents(source_dir: Path) -> DocumentSet:
    docs = pl.read_parquet(source_dir / "docs.parquet")
    path = source_dir / "tokens.bin"
    tokens = np.memmap(path, dtype="<u4", mode="r") if path.stat().st_size else np.zeros(0, "<u4")
    return DocumentSet(docs, tokens)


def tokenize_source(
    name: str,
    spec: SourceSpec,
    files: Iterable[str],
    tokenizer: TextTokenizer,
    out_dir: Path,
    progress: Callable[[str], None] = lambda _msg: None,
) -> TokenizeReport:
    """Tokenize every record of ``files`` (in order) into ``out_dir``; malformed records are quarantined."""
    out_dir.mkdir(parents=True, exist_ok=True)
    meta: dict[str, list] = {k: [] for k in ("file", "line", "n_tokens", "offset")}
    reasons: Counter[str] = Counter()
    seen = kept = n_tokens = bytes_in = 0
    with (
        atomic_path(out_dir / "tokens.bin") as tok_tmp,
        atomic_path(out_dir / "quarantine.jsonl") as q_tmp,
        tok_tmp.open("wb") as tok_f,
        q_tmp.open("w") as q_f,
    ):
        batch: list[Record] = []
        batch_bytes = 0

        def flush() -> None:
            nonlocal kept, n_tokens, batch_bytes
            if not batch:
                return
            for rec, ids in zip(batch, tokenizer.encode_batch([r.text or "" for r in batch]), strict=True):
                arr = np.asarray(ids, dtype="<u4")
                meta["file"].append(rec.file)
                meta["line"].append(rec.line)
                meta["n_tokens"].append(len(arr))
                meta["offset"].append(n_tokens)
                tok_f.write(arr.tobytes())
                n_tokens += len(arr)
                kept += 1
            batch.clear()
            batch_bytes = 0

        for i, path in enumerate(files, start=1):
            for rec in read_records(path, spec):
                seen += 1
                reason = rec.error or ("empty document" if not (rec.text or "").strip() else None)
                if reason is not None:
                    reasons[reason.split(":")[0]] += 1
                    q_f.write(json.dumps({"file": rec.file, "line": rec.line, "reason": reason}) + "\n")
                    continue
                assert rec.text is not None
                size = len(rec.text.encode("utf-8"))
                bytes_in += size
                batch.append(rec)
                batch_bytes += size
                if batch_bytes >= _BATCH_BYTES:
                    flush()
            flush()
            progress(f"{name}: {i} files, {kept} documents, {n_tokens} tokens")
        flush()
    df = pl.DataFrame(
        {"doc_id": np.arange(kept, dtype=np.int64), "source": [name] * kept, **meta},
        schema={
            "doc_id": pl.Int64,
            "source": pl.String,
            "file": pl.String,
            "line": pl.Int64,
            "n_tokens": pl.Int64,
            "offset": pl.Int64,
        },
    )
    with atomic_path(out_dir / "docs.parquet") as tmp:
        df.write_parquet(tmp)
    return TokenizeReport(seen, kept, seen - kept, n_tokens, bytes_in, dict(reasons))
