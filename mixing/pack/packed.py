"""Materialize a packing as shards: gather each sequence's tokens from the sources, record the build."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from mixing.format.layout import BuildLayout
from mixing.format.manifest import BuildInfo, Manifest, PackingNote, PhaseSpan, Regroup, SourceCounts
from mixing.format.shard_writer import token_dtype, write_shards
from mixing.ingest.documents import DocumentSet, open_documents
from mixing.pack.packing import Packing
from mixing.spec.mixfile import Mix

__all__ = ["gather_tokens", "write_packed"]

_SHARD_TOKENS = 1 << 24  # ~32-64 MB of tokens per shard
_SLICE_TOKENS = 256  # segments this long are copied as slices; shorter ones in one vectorized gather


def gather_tokens(
    packing: Packing, sources: dict[str, DocumentSet], lo: int, hi: int, dtype: Any, pad_id: int
) -> np.ndarray:
    """Tokens of sequences ``lo..hi-1`` of ``packing``, array [hi-lo, S] of ``dtype``, padded with ``pad_id``.

    Short segments go through one fancy-index gather per source; long ones (≥ ``_SLICE_TOKENS``, hence
    few per sequence) are slice copies, which avoids index arrays as large as the tokens themselves.
    """
    seq_len = packing.seq_len
    out = np.full((hi - lo, seq_len), pad_id, dtype=dtype)
    s0, s1 = int(packing.seg_offsets[lo]), int(packing.seg_offsets[hi])
    segs = packing.segments[s0:s1]
    if not len(segs):
        return out
    counts = np.diff(packing.seg_offsets[lo : hi + 1])
    seq_of = np.repeat(np.arange(hi - lo, dtype=np.int64), counts)
    ends = np.cumsum(segs[:, 3])
    starts_all = ends - segs[:, 3]  # start of each segment in the concatenation of this block's segments
    first_seg = np.cumsum(counts) - counts
    seq_base = np.repeat(starts_all[np.minimum(first_seg, len(segs) - 1)], counts)
    dst = seq_of * seq_len + (starts_all - seq_base)  # flat slot of each segment's first token
    flat = out.reshape(-1)
    long = segs[:, 3] >= _SLICE_TOKENS
    for k, name in enumerate(packing.sources):
        mine = segs[:, 0] == k
        if not mine.any():
            continue
        ds = sources[name]
        offsets = ds.docs["offset"].to_numpy()
        src0 = np.zeros(len(segs), np.int64)
        src0[mine] = offsets[segs[mine, 1]] + segs[mine, 2]
        # long segments: one slice copy each (few of them); short ones: one fancy-index gather in all
        big = mine & long
        for d, s, n in zip(dst[big].tolist(), src0[big].tolist(), segs[big, 3].tolist(), strict=True):
            flat[d : d + n] = ds.tokens[s : s + n]
        short = mine & ~long
        length = segs[short, 3]
        run = np.arange(int(length.sum()), dtype=np.int64) - np.repeat(np.cumsum(length) - length, length)
        flat[np.repeat(dst[short], length) + run] = ds.tokens[np.repeat(src0[short], length) + run]
    return out


def write_packed(
    mix: Mix,
    layout: BuildLayout,
    packing: Packing,
    tokenizer_fingerprint: str,
    vocab_size: int,
    pad_id: int,
    *,
    eos_id: int | None = None,
    on_shard: Callable[[int], None] = lambda _k: None,
    out: str | Path | None = None,
    storage_options: dict[str, Any] | None = None,
) -> Manifest:
    """Gather each sequence's tokens from the sources and write shards plus manifest; return the manifest.

    Shards go to ``out`` (a folder or fsspec URL such as ``s3://bucket/prefix``; default the build's
    ``shards/``), with ``storage_options`` for the filesystem.

    The manifest's ``per_source`` records, for each source: ``tokens_planned`` (Σ planned unit lengths),
    ``tokens_packed``, ``tokens_dropped`` (planned = packed + dropped) and ``documents_packed``.
    """
    seq_len = packing.seq_len
    dtype = token_dtype(vocab_size)
    docsets = {name: open_documents(layout.source_dir(name)) for name in packing.sources}
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        planned = dict(con.sql("SELECT source, sum(length)::BIGINT FROM plan_units GROUP BY 1").fetchall())
        phases = con.sql(
            "SELECT phase, min(step)::BIGINT, count(DISTINCT step)::BIGINT FROM plan_quotas GROUP BY 1 ORDER BY 2"
        ).fetchall()
    per_source = {}
    for k, name in enumerate(packing.sources):
        seg = packing.segments[packing.segments[:, 0] == k]
        drop = packing.dropped[packing.dropped[:, 0] == k]
        per_source[name] = SourceCounts(
            tokens_planned=int(planned.get(name, 0)),
            tokens_packed=int(seg[:, 3].sum()),
            tokens_dropped=int(drop[:, 3].sum()),
            documents_packed=len(np.unique(seg[:, 1])),
            documents_dropped=len(np.unique(drop[:, 1])),
        )
    balance = mix.balance
    info = BuildInfo(
        mix=mix.name,
        mix_fingerprint=mix.fingerprint(),
        tokenizer_fingerprint=tokenizer_fingerprint,
        vocab_size=vocab_size,
        pad_id=pad_id,
        eos_id=eos_id,  # documents end with it (unless the mix says eos: false); pad_id differs when it can
        seed=mix.seed,  # the mix's seed: the loader's default, so that one seed fixes the whole run
        global_batch=mix.sequence.global_batch,
        cost=balance.cost.model(),
        micro_batches=balance.micro_batches,
        max_tokens=balance.max_tokens,
        regroup=Regroup(**balance.regroup.model_dump()) if balance.regroup else None,
        steps=mix.total_steps,
        sources=tuple(packing.sources),
        phases=tuple(PhaseSpan(phase=p, first_step=s, steps=c) for p, s, c in phases),
        per_source=per_source,
        packing=PackingNote(
            algorithm="best-fit-decreasing per step steered by per-source quota deficits, cost-aware ties, "
            "lookahead fill within phase"
        ),
    )
    return write_shards(
        layout.shards_dir if out is None else out,
        lambda lo, hi: gather_tokens(packing, docsets, lo, hi, dtype, pad_id),
        packing.seq_step,
        packing.seg_offsets,
        packing.segments,
        max(1, _SHARD_TOKENS // seq_len),
        info,
        seq_len=seq_len,
        on_shard=on_shard,
        storage_options=storage_options,
    )
