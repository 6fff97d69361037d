"""The synthetic build ``benchmarks/lookup.py`` times ``weir lookup`` on: the sources' document indexes and the
packed shards, written straight into a build folder (nothing is tokenized).

- :func:`make_build`: the whole build under ``out`` (unless its manifest is there): deterministic for its
  arguments (fixed seeds); :func:`doc_lengths`, :func:`write_doc_index` and :func:`pack_shard` its parts.
- :data:`LAYOUTS`: how ``docs.parquet`` may be encoded; :data:`SOURCES`: the sources (name, file suffix, share).

The build (made once by ``benchmarks/lookup.py``, kept under its ``--dir``:
``build/bench/lookup-<docs>-<S>-<batch>-<steps>-<rows>-<layout>/``, reused when its manifest is there): three
sources of ``--docs`` documents each, written straight into the build's files (nothing is tokenized: ~2 s per
million documents on the shared 2-core machine):

- ``sources/<name>/docs.parquet``: the columns of :data:`mixing.ingest.doc_index.INDEX_SCHEMA`, written by a
  ``ParquetWriter`` as the build's index writer writes them (``--layout weir``:
  :data:`mixing.ingest.doc_index.INDEX_ENCODING`; ``defaults``: pyarrow's, dictionary encoding and snappy; one
  ``write_table`` per chunk): one chunk, file and row group per :data:`~mixing.ingest.chunks.CHUNK_BYTES`
  of input (16 MiB ÷ ~1 KB a document: ``--group-rows`` 16,384
  rows), lines 1… within each file; documents of log-normal lengths (median 160 tokens, mean ~240, EOS
  included); sources ``web`` (``.jsonl``), ``table`` (``.parquet``) and ``code`` (``.tar``, each document's
  metadata JSON naming its member, as code sources keep it);
- ``shards/``: ``--steps`` steps of ``--global-batch`` sequences of ``--seq-len`` tokens (by default the demo
  mix's shape, S=2048 and 16 sequences), in shards of 16 Mi tokens (weir's), each sequence full: documents drawn
  uniformly at random from the sources (shares 1/2, 1/4, 1/4; a build samples its documents across the whole
  source) laid end to end and cut every S tokens, so a document may be split over sequences (``start`` > 0).
  Metadata as the packer writes it (``meta.npz``, real costs); the token files are sparse (``truncate``) but
  for the sequences of the sampled steps, which hold random token ids: decoded with the DeepSeek tokenizer of
  ``../shared/tokenizers`` (the build's ``tokenizer.json``) when it is there, else weir's byte tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.loader_index import write_sparse_shard
from mixing.ingest.doc_index import INDEX_ENCODING

__all__ = [
    "DEEPSEEK",
    "FINGERPRINT",
    "LAYOUTS",
    "MEDIAN",
    "SHARD_TOKENS",
    "SHARED",
    "SIGMA",
    "SOURCES",
    "doc_lengths",
    "make_build",
    "pack_shard",
    "write_doc_index",
]

ROOT = Path(__file__).resolve().parent.parent
SHARED = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()), None)
DEEPSEEK = SHARED / "tokenizers" / "deepseek_tokenizer.json" if SHARED else None
SOURCES = (("web", ".jsonl", 0.5), ("table", ".parquet", 0.25), ("code", ".tar", 0.25))  # name, file suffix, share
FINGERPRINT = hashlib.sha256(b"lookup-bench-tokenizer").hexdigest()
SHARD_TOKENS = 1 << 24  # mixing.pack.packed's tokens per shard
MEDIAN, SIGMA = 160, 0.9  # document lengths, log-normal: mean = median · exp(σ²/2) ≈ 240 tokens
LAYOUTS: dict[str, dict[str, Any]] = {
    "weir": INDEX_ENCODING,  # what mixing.ingest.doc_index writes
    "defaults": {},  # pyarrow's defaults (every column dictionary-encoded where it fits, snappy): the layout before
}


def doc_lengths(k: int, n: int) -> np.ndarray:
    """Source ``k``'s ``n`` document lengths (int64, EOS included, 2 … 65,536), the same on every call."""
    rng = np.random.default_rng(1000 + k)
    return np.clip(rng.lognormal(np.log(MEDIAN), SIGMA, n), 2, 1 << 16).astype(np.int64)


def write_doc_index(path: Path, name: str, suffix: str, lengths: np.ndarray, group_rows: int, layout: str) -> None:
    """``docs.parquet`` of source ``name`` as the build's index writer writes it (``layout``: see
    :data:`LAYOUTS`): one chunk (one input file, one row group of ``group_rows`` rows)
    at a time."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from mixing.ingest.doc_index import INDEX_SCHEMA

    schema = pl.DataFrame(schema=INDEX_SCHEMA).to_arrow().schema
    tmp = path.with_suffix(".tmp")
    with pq.ParquetWriter(tmp, schema, **LAYOUTS[layout]) as writer:
        for g, lo in enumerate(range(0, len(lengths), group_rows)):
            n_tok = lengths[lo : lo + group_rows]
            m = len(n_tok)
            line = np.arange(1, m + 1, dtype=np.int64)
            if suffix == ".tar":  # a code document's metadata names its member
                members = pc.cast(pa.array(line), pa.large_string())
                head, tail = (
                    pa.scalar(t, pa.large_string()) for t in ('{"path": "pkg/m', '.py", "language": "python"}')
                )
                meta = pc.binary_join_element_wise(head, members, tail, pa.scalar("", pa.large_string()))
            else:
                meta = pa.nulls(m, pa.large_string())
            columns = {
                "doc_id": pa.array(np.arange(lo, lo + m, dtype=np.int64)),
                "source": pa.repeat(pa.scalar(name, pa.large_string()), m),
                "file": pa.repeat(pa.scalar(f"s3://corpus/{name}/part-{g:05d}{suffix}", pa.large_string()), m),
                "line": pa.array(line),
                "n_tokens": pa.array(n_tok),
                "chunk": pa.repeat(pa.scalar(hashlib.md5(f"{name}{g}".encode()).hexdigest(), pa.large_string()), m),
                "offset": pa.array(np.cumsum(n_tok) - n_tok),
                "meta": meta,
                "tokenizer": pa.repeat(pa.scalar(FINGERPRINT, pa.large_string()), m),
            }
            writer.write_table(pa.table(columns, schema=schema))
    tmp.rename(path)


def pack_shard(
    rng: np.random.Generator, lengths: list[np.ndarray], n_seq: int, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """``n_seq`` full sequences of documents drawn at random (the sources' shares), end to end, cut every
    ``seq_len`` tokens: (seg_offsets int64 [n_seq+1], segments int64 [m, 4] (source, doc_id, start, length))."""
    need = n_seq * seq_len
    shares = np.array([s for _, _, s in SOURCES])
    mean = float(sum(s * float(ln.mean()) for s, ln in zip(shares, lengths, strict=True)))
    src_parts, doc_parts, len_parts, total = [], [], [], 0
    while total < need:
        m = int((need - total) / mean * 1.1) + 64
        src = rng.choice(len(lengths), m, p=shares)
        doc = np.zeros(m, np.int64)
        ln = np.zeros(m, np.int64)
        for k, lk in enumerate(lengths):
            mine = src == k
            doc[mine] = rng.integers(0, len(lk), int(mine.sum()))
            ln[mine] = lk[doc[mine]]
        src_parts.append(src)
        doc_parts.append(doc)
        len_parts.append(ln)
        total += int(ln.sum())
    src, doc, ln = (np.concatenate(p) for p in (src_parts, doc_parts, len_parts))
    end = np.cumsum(ln)
    cuts = np.union1d(np.r_[0, end[end < need]], np.arange(0, need + 1, seq_len))  # document and sequence ends
    a, b = cuts[:-1], cuts[1:]
    j = np.searchsorted(end, a, side="right")  # the document holding token a of the stream
    segments = np.stack([src[j], doc[j], a - (end[j] - ln[j]), b - a], 1).astype(np.int64)
    seq = a // seq_len
    offsets = np.concatenate([[0], np.cumsum(np.bincount(seq, minlength=n_seq))]).astype(np.int64)
    return offsets, segments


def make_build(
    out: Path, docs: int, seq_len: int, batch: int, steps: int, group_rows: int, layout: str, sampled: list[int]
) -> Path:
    """The synthetic build (see the module's docstring), unless ``out/shards/manifest.json`` is there."""
    from contract.cost import CostModel
    from contract.manifest import write_manifest

    if (out / "shards" / "manifest.json").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    lengths = [doc_lengths(k, docs) for k in range(len(SOURCES))]
    for (name, suffix, _), ln in zip(SOURCES, lengths, strict=True):
        (out / "sources" / name).mkdir(parents=True)
        write_doc_index(out / "sources" / name / "docs.parquet", name, suffix, ln, group_rows, layout)
    tok_dir = out / "tokenizer"
    tok_dir.mkdir()
    if DEEPSEEK is not None and DEEPSEEK.exists():
        shutil.copy(DEEPSEEK, tok_dir / "tokenizer.json")
        spec, vocab = {"kind": "hf", "bos": False, "eos": True}, 129_280
    else:
        spec, vocab = {"kind": "bytes", "bos": False, "eos": True}, 257
    (tok_dir / "spec.json").write_text(json.dumps(spec))
    dtype = np.dtype("<u2" if vocab <= 1 << 16 else "<u4")
    shards_dir = out / "shards"
    shards_dir.mkdir()
    cost = CostModel()
    rng = np.random.default_rng(0)
    n = steps * batch
    per_shard = max(1, SHARD_TOKENS // seq_len)
    wanted = {s for t in sampled for s in range(t * batch, (t + 1) * batch)}
    shards = []
    for k, lo in enumerate(range(0, n, per_shard)):
        hi = min(n, lo + per_shard)
        offsets, segments = pack_shard(rng, lengths, hi - lo, seq_len)
        length = segments[:, 3]
        meta = {
            "step": (np.arange(lo, hi) // batch).astype(np.int64),
            "seg_offsets": offsets,
            "segments": segments,
            "seg_cost": cost.of(length),
            "seq_tokens": np.full(hi - lo, seq_len, np.int64),
            "seq_cost": cost.sequences(offsets, length),
        }
        tok, files = write_sparse_shard(shards_dir, k, meta, (hi - lo, seq_len), dtype)  # sparse, but for
        rows = sorted(s - lo for s in wanted if lo <= s < hi)  # the sampled steps' sequences
        if rows:
            mm = np.load(tok, mmap_mode="r+")
            mm[rows] = rng.integers(0, vocab - 1, (len(rows), seq_len)).astype(dtype)
            mm.flush()
            del mm
        shards.append({"first_sequence": lo, "sequences": hi - lo, "files": files})
    manifest = {
        "format_version": 3,
        "seq_len": seq_len,
        "sequences": n,
        "sequences_per_step": batch,
        "dtype": dtype.name,
        "global_batch": batch,
        "steps": steps,
        "pad_id": 0,
        "eos_id": vocab - 1,
        "vocab_size": vocab,
        "tokenizer_fingerprint": FINGERPRINT,
        "sources": [name for name, _, _ in SOURCES],
        "cost": {"attention": cost.attention, "linear": cost.linear},
        "shards": shards,
    }
    write_manifest(shards_dir, manifest)
    return out
