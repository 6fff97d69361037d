"""Materialize a packing as shards, and summarize a finished build (what ``weir inspect`` prints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from mixing.documents import open_documents
from mixing.layout import BuildLayout
from mixing.mixfile import Mix
from mixing.packing import Packing
from mixing.shards import ShardSet, write_shards

__all__ = ["inspect_build", "write_packed"]

_SHARD_TOKENS = 1 << 24  # ~32-64 MB of tokens per shard


def write_packed(
    mix: Mix, layout: BuildLayout, packing: Packing, tokenizer_fingerprint: str, vocab_size: int, pad_id: int
) -> dict[str, Any]:
    """Gather each sequence's tokens from the sources and write shards plus manifest; return the manifest.

    The manifest's ``per_source`` records, for each source: ``tokens_planned`` (Σ planned unit lengths),
    ``tokens_packed``, ``tokens_dropped`` (planned = packed + dropped) and ``documents_packed``.
    """
    seq_len = packing.seq_len
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
    docsets = {name: open_documents(layout.source_dir(name)) for name in packing.sources}
    offsets = {name: ds.docs["offset"].to_numpy() for name, ds in docsets.items()}
    n = len(packing.seq_step)
    tokens = np.full((n, seq_len), pad_id, dtype=dtype)
    for i in range(n):
        pos = 0
        for src, doc, start, length in packing.segments[packing.seg_offsets[i] : packing.seg_offsets[i + 1]]:
            name = packing.sources[src]
            base = offsets[name][doc] + start
            tokens[i, pos : pos + length] = docsets[name].tokens[base : base + length]
            pos += length
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        planned = dict(con.sql("SELECT source, sum(length)::BIGINT FROM plan_units GROUP BY 1").fetchall())
        phases = con.sql(
            "SELECT phase, min(step)::BIGINT, count(DISTINCT step)::BIGINT FROM plan_quotas GROUP BY 1 ORDER BY 2"
        ).fetchall()
    per_source = {}
    for k, name in enumerate(packing.sources):
        seg = packing.segments[packing.segments[:, 0] == k]
        drop = packing.dropped[packing.dropped[:, 0] == k]
        per_source[name] = {
            "tokens_planned": int(planned.get(name, 0)),
            "tokens_packed": int(seg[:, 3].sum()),
            "tokens_dropped": int(drop[:, 3].sum()),
            "documents_packed": len(np.unique(seg[:, 1])),
        }
    manifest = {
        "mix": mix.name,
        "mix_fingerprint": mix.fingerprint(),
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "vocab_size": vocab_size,
        "pad_id": pad_id,
        "global_batch": mix.sequence.global_batch,
        "cost": mix.balance.cost.model_dump(),
        "steps": mix.total_steps,
        "sources": list(packing.sources),
        "phases": [{"phase": p, "first_step": s, "steps": c} for p, s, c in phases],
        "per_source": per_source,
    }
    return write_shards(
        layout.shards_dir,
        tokens,
        packing.seq_step,
        packing.seg_offsets,
        packing.segments,
        max(1, _SHARD_TOKENS // seq_len),
        manifest,
    )


def inspect_build(root: Path) -> dict[str, Any]:
    """Figures of a finished build, recomputed from its shards (not copied from the manifest).

    Keys: ``sequences``, ``steps``, ``seq_len``, ``tokens`` (real, non-padding), ``packing_efficiency``
    (tokens ÷ (sequences × S)), ``truncated_docs`` (documents ≤ S split ÷ documents packed),
    ``per_source`` (documents and tokens indexed; tokens planned, packed, dropped; documents packed),
    ``corrupt_files`` (shard files whose checksum does not match the manifest).
    """
    layout = BuildLayout(root)
    shards = ShardSet(layout.shards_dir)
    m = shards.manifest
    segs = [shards.sequence(i).segments for i in range(len(shards))]
    allseg = np.concatenate(segs) if segs else np.zeros((0, 4), np.int64)
    tokens = int(allseg[:, 3].sum())
    seq_len = int(m["seq_len"])
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        lengths = {(s, d): n for s, d, n in con.sql("SELECT source, doc_id, n_tokens FROM documents").fetchall()}
        indexed = {
            s: (d, t)
            for s, d, t in con.sql(
                "SELECT source, count(*), sum(n_tokens)::BIGINT FROM documents GROUP BY 1"
            ).fetchall()
        }
    docs, split = set(), set()
    for src, doc, _start, length in allseg.tolist():
        key = (m["sources"][src], doc)
        docs.add(key)
        if lengths[key] <= seq_len and length < lengths[key]:
            split.add(key)
    per_source = {}
    for k, name in enumerate(m["sources"]):
        mine = allseg[allseg[:, 0] == k]
        per_source[name] = {
            **m["per_source"][name],
            "documents_indexed": indexed.get(name, (0, 0))[0],
            "tokens_indexed": indexed.get(name, (0, 0))[1],
            "tokens_packed": int(mine[:, 3].sum()),
            "documents_packed": len(np.unique(mine[:, 1])),
        }
    n = len(shards)
    return {
        "mix": m["mix"],
        "sequences": n,
        "steps": int(m["steps"]),
        "seq_len": seq_len,
        "global_batch": int(m["global_batch"]),
        "tokens": tokens,
        "packing_efficiency": tokens / (n * seq_len) if n else 0.0,
        "truncated_docs": len(split) / len(docs) if docs else 0.0,
        "per_source": per_source,
        "phases": m["phases"],
        "corrupt_files": shards.verify(),
    }
