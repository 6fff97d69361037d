"""A source's document index, written from its checked chunks one chunk at a time.

``docs.parquet`` (the columns of :data:`INDEX_SCHEMA`; rows in chunk order, then file and record order, in row
groups of at most :data:`~mixing.ingest.chunks.INDEX_ROWS` rows, never across two chunks) and ``quarantine.jsonl``
go to a local folder, each to a temporary name renamed into place only when every chunk read back as its report
says. Memory is one row group and one quarantine line at a time, whatever the size of the chunks or of the
source: the driver of a build never holds a source's index (nor any token), nor a whole chunk's.
"""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow.parquet as pq

from contract.atomic import atomic_path
from contract.store import Store
from mixing.ingest.chunk_store import check_chunk
from mixing.ingest.chunks import CHUNK_SCHEMA, INDEX_ROWS, ChunkDamaged

__all__ = ["INDEX_ENCODING", "INDEX_SCHEMA", "ChunksDamaged", "IndexCounts", "write_index"]

_INTS = ("doc_id", "line", "n_tokens", "offset")
INDEX_ENCODING: dict[str, Any] = {
    # How docs.parquet is encoded (pyarrow.parquet.ParquetWriter's options). The integer columns are delta-encoded
    # and not compressed (doc_id, line and offset are runs, n_tokens small), so reading one row group — what
    # `weir lookup` does per document it shows — decodes no dictionary page of 16 Ki distinct values; `meta`
    # (each document's own JSON, if any) is plain; the repeated strings keep their dictionaries. Against pyarrow's
    # defaults: a lookup of 10 M-document sources 114 -> 69 ms, the files 6x smaller (docs/benchmarks.md).
    "use_dictionary": ["source", "file", "chunk", "tokenizer"],
    "column_encoding": dict.fromkeys(_INTS, "DELTA_BINARY_PACKED"),
    "compression": {
        **dict.fromkeys(_INTS, "none"),
        **dict.fromkeys(("source", "file", "chunk", "meta", "tokenizer"), "snappy"),
    },
}

INDEX_SCHEMA = {
    "doc_id": pl.Int64,  # 0..n-1 over the source
    "source": pl.String,
    "file": pl.String,
    "line": pl.Int64,
    "n_tokens": pl.Int64,
    "chunk": pl.String,  # the key of the chunk holding its tokens
    "offset": pl.Int64,  # its first token's position in that chunk's tokens.bin
    "meta": pl.String,  # JSON, or null
    "tokenizer": pl.String,  # the fingerprint of the tokenizer that made them
}
_SAMPLE = 20  # bad records per reason listed in the counts (all are in quarantine.jsonl)


class ChunksDamaged(Exception):
    """Chunks that do not read back as their reports say: ``bad`` maps each key to what is wrong."""

    def __init__(self, bad: dict[str, str]) -> None:
        super().__init__("; ".join(f"{k}: {why}" for k, why in bad.items()))
        self.bad = bad


@dataclass
class IndexCounts:
    """What the chunks held, summed: ``seen == kept + quarantined`` when the chunks are sound."""

    seen: int = 0
    kept: int = 0
    quarantined: int = 0  # counted from the quarantine lines, so the identity is a check
    tokens: int = 0
    bytes_in: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    missing: Counter[str] = field(default_factory=Counter)
    sample: list[dict[str, Any]] = field(default_factory=list)  # up to _SAMPLE {file, line, reason} per reason
    records: list[dict[str, Any]] = field(default_factory=list)  # {name, bytes, sha256} of each report.json


def write_index(name: str, keys: list[str], chunks: Store, *, deep: bool, tokenizer: str, out: Path) -> IndexCounts:
    """Check the chunks ``keys`` of source ``name`` (their tokens too when ``deep``) and write ``out/docs.parquet``
    and ``out/quarantine.jsonl`` from them, in order; ``tokenizer`` is its fingerprint.

    Raises :class:`ChunksDamaged` naming every chunk that fails (after checking them all); then neither file is
    replaced. Each chunk's files are checked, then read :data:`~mixing.ingest.chunks.INDEX_ROWS` rows and one
    quarantine line at a time (a remote chunk's through a local copy), and ``docs.parquet`` gets row groups of
    at most that many rows: memory stays that of one row group, however large the chunks or the source.
    """
    counts = IndexCounts()
    bad: dict[str, str] = {}
    schema = pl.DataFrame(schema=INDEX_SCHEMA).to_arrow().schema
    per_reason: Counter[str] = Counter()
    with (
        tempfile.TemporaryDirectory(prefix="weir-index-") as scratch,
        atomic_path(out / "quarantine.jsonl") as q_tmp,
        q_tmp.open("wb") as q_f,
        atomic_path(out / "docs.parquet") as d_tmp,
        pq.ParquetWriter(d_tmp, schema, **INDEX_ENCODING) as writer,
    ):
        for k in keys:
            try:
                c = check_chunk(chunks, k, tokens=deep, into=Path(scratch))
            except ChunkDamaged as e:
                bad[k] = str(e)
                continue
            if bad:  # the files will not be kept: only find the other damaged chunks
                continue
            assert c.docs is not None and c.quarantine is not None, "check_chunk(into=...) gives both files"
            counts.records.append(c.record)
            counts.seen += c.report["seen"]
            counts.bytes_in += c.report["bytes_in"]
            counts.reasons.update(c.report["reasons"])
            counts.missing.update(c.report["missing"])
            offset = 0  # the next document's first token in the chunk's tokens.bin
            for batch in pq.ParquetFile(c.docs).iter_batches(batch_size=INDEX_ROWS, columns=list(CHUNK_SCHEMA)):
                part = pl.from_arrow(batch)
                assert isinstance(part, pl.DataFrame)
                docs = part.select(
                    pl.int_range(counts.kept, counts.kept + part.height, dtype=pl.Int64).alias("doc_id"),
                    pl.lit(name, pl.String).alias("source"),
                    "file",
                    "line",
                    "n_tokens",
                    pl.lit(k, pl.String).alias("chunk"),
                    (pl.col("n_tokens").cum_sum() - pl.col("n_tokens") + offset).cast(pl.Int64).alias("offset"),
                    "meta",
                    pl.lit(tokenizer, pl.String).alias("tokenizer"),
                )
                writer.write_table(docs.to_arrow().cast(schema))
                tokens = int(part["n_tokens"].sum())
                counts.kept += docs.height
                counts.tokens += tokens
                offset += tokens
            with c.quarantine.open("rb") as lines:
                for line in lines:  # split at b"\n" only: U+2028 and friends may be inside a string
                    q_f.write(line)
                    if not line.strip(b"\n"):
                        continue
                    counts.quarantined += 1
                    row = json.loads(line)
                    if per_reason[row["reason"]] < _SAMPLE:
                        per_reason[row["reason"]] += 1
                        counts.sample.append({f: row[f] for f in ("file", "line", "reason")})
        if bad:
            raise ChunksDamaged(bad)  # inside: the temporary files are removed, the old ones stay
    return counts
