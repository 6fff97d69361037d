"""Materialize a packing as shards: gather each sequence's tokens from the sources' chunks, record the build.

The shards are independent work items (:class:`ShardJob`): each carries its sequences' segments and where
each segment's tokens are (chunk, first token), and :func:`write_shard_job` gathers them from the build
root and writes the shard's two files there. The engine (:mod:`mixing.engine`) runs them: in this process,
or as Ray tasks in parallel. The driver writes the manifest last, listing every shard with its checksums.
A job is a function of the plan alone, so every engine writes the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl

from mixing.engine import LOCAL, Engine
from mixing.format.cost import CostModel
from mixing.format.layout import BuildLayout
from mixing.format.manifest import BuildInfo, Manifest, PackingNote, PhaseSpan, Regroup, ShardEntry, SourceCounts
from mixing.format.shard_writer import open_shards, seal_shards, token_dtype, write_shard
from mixing.format.store import Store
from mixing.ingest.chunk_store import ChunkTokens
from mixing.pack.packing import Packing
from mixing.spec.mixfile import Mix

__all__ = ["ShardContext", "ShardJob", "write_packed", "write_shard_job"]

_SHARD_TOKENS = 1 << 24  # ~32-64 MB of tokens per shard


@dataclass(frozen=True)
class ShardContext:
    """What every shard job of one build needs (shipped once to a distributed engine's workers)."""

    shards_url: str
    storage_options: dict[str, Any] | None  # of the shards' folder
    source_chunks: tuple[str, ...]  # the chunks/ folder of each source, in the packing's source order
    chunk_options: dict[str, Any] | None  # of the build root that holds the chunks
    chunk_keys: tuple[tuple[int, str], ...]  # global chunk id → (source index, chunk key)
    seq_len: int
    dtype: str
    pad_id: int
    cost: CostModel


@dataclass(frozen=True)
class ShardJob:
    """Shard ``k``: sequences ``first..first+n-1`` with ``step`` [n], ``seg_offsets`` [n+1] (from 0) into
    ``segments`` [m, 4] (source, doc_id, start, length), and each segment's ``chunk`` int64 [m] (global chunk
    id) and ``src`` int64 [m] (its first token's position in that chunk)."""

    k: int
    first: int
    step: np.ndarray
    seg_offsets: np.ndarray
    segments: np.ndarray
    chunk: np.ndarray
    src: np.ndarray


def write_shard_job(ctx: ShardContext, job: ShardJob) -> ShardEntry:
    """Gather shard ``job``'s tokens from the chunks and write its files to ``ctx.shards_url``; its entry."""
    n, lengths = len(job.step), job.segments[:, 3]
    readers: dict[int, ChunkTokens] = {}
    parts: list[np.ndarray] = [np.zeros(0, np.uint32)] * len(lengths)
    for c in np.unique(job.chunk).tolist():
        sel = np.flatnonzero(job.chunk == c)
        source, key = ctx.chunk_keys[c]
        if source not in readers:
            readers[source] = ChunkTokens(Store(ctx.source_chunks[source], ctx.chunk_options))
        for i, arr in zip(sel.tolist(), readers[source].ranges(key, job.src[sel], lengths[sel]), strict=True):
            parts[i] = arr
    block = np.full((n, ctx.seq_len), ctx.pad_id, dtype=ctx.dtype)
    for i in range(n):
        a, b = int(job.seg_offsets[i]), int(job.seg_offsets[i + 1])
        if b > a:
            row = np.concatenate(parts[a:b])
            block[i, : len(row)] = row
    store = Store(ctx.shards_url, ctx.storage_options)
    return write_shard(store, job.k, job.first, block, job.step, job.seg_offsets, job.segments, ctx.cost)


def _jobs(packing: Packing, chunk_of: list[np.ndarray], src_of: list[np.ndarray], per_shard: int) -> Iterator[ShardJob]:
    """The shard jobs of ``packing``, in order; ``chunk_of[s]``/``src_of[s]``: per document of source ``s``."""
    n = len(packing.seq_step)
    for k, lo in enumerate(range(0, n, per_shard)):
        hi = min(n, lo + per_shard)
        s0, s1 = int(packing.seg_offsets[lo]), int(packing.seg_offsets[hi])
        segs = np.ascontiguousarray(packing.segments[s0:s1])
        chunk = np.zeros(len(segs), np.int64)
        src = np.zeros(len(segs), np.int64)
        for s in np.unique(segs[:, 0]).tolist():
            mine = segs[:, 0] == s
            chunk[mine] = chunk_of[s][segs[mine, 1]]
            src[mine] = src_of[s][segs[mine, 1]] + segs[mine, 2]
        off = packing.seg_offsets[lo : hi + 1] - s0
        yield ShardJob(k, lo, np.array(packing.seq_step[lo:hi]), np.array(off), segs, chunk, src)


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
    engine: Engine = LOCAL,
) -> Manifest:
    """Gather each sequence's tokens from the sources' chunks and write shards plus manifest; return the manifest.

    Shards go to ``out`` (a folder or fsspec URL such as ``s3://bucket/prefix``; default the build's
    ``shards/``, at ``layout.url``), with ``storage_options`` for the filesystem (default the layout's). The
    shards are written by ``engine``; ``on_shard(k)`` runs in this process as shard ``k`` is done (any order).

    The manifest's ``per_source`` records, for each source: ``tokens_planned`` (Σ planned unit lengths),
    ``tokens_packed``, ``tokens_dropped`` (planned = packed + dropped) and ``documents_packed``.
    """
    info = _build_info(mix, layout, packing, tokenizer_fingerprint, vocab_size, pad_id, eos_id)
    options = storage_options if out is not None else layout.storage_options
    store = open_shards(out if out is not None else f"{layout.url}/shards", options)
    chunk_keys: list[tuple[int, str]] = []
    chunk_of, src_of = [], []
    for s, name in enumerate(packing.sources):
        docs = pl.read_parquet(layout.source_dir(name) / "docs.parquet", columns=["chunk", "offset"])
        keys = docs["chunk"].unique(maintain_order=True).to_list()
        ids = {k: len(chunk_keys) + i for i, k in enumerate(keys)}
        chunk_keys += [(s, k) for k in keys]
        chunk_of.append(docs["chunk"].replace_strict(ids, return_dtype=pl.Int64).to_numpy())
        src_of.append(docs["offset"].to_numpy())
    ctx = ShardContext(
        shards_url=store.url,
        storage_options=store.storage_options,
        source_chunks=tuple(f"{layout.url}/sources/{name}/chunks" for name in packing.sources),
        chunk_options=layout.storage_options,
        chunk_keys=tuple(chunk_keys),
        seq_len=packing.seq_len,
        dtype=np.dtype(token_dtype(vocab_size)).name,
        pad_id=pad_id,
        cost=info.cost,
    )
    shards: dict[int, ShardEntry] = {}
    jobs = _jobs(packing, chunk_of, src_of, max(1, _SHARD_TOKENS // packing.seq_len))
    for _i, entry in engine.map(write_shard_job, jobs, ctx, "write_shard"):
        k = len(shards)
        shards[entry.first_sequence] = entry
        on_shard(k)
    ordered = [shards[first] for first in sorted(shards)]
    return seal_shards(store, info, ordered, np.asarray(packing.seq_step), packing.seq_len, ctx.dtype)


def _build_info(
    mix: Mix,
    layout: BuildLayout,
    packing: Packing,
    tokenizer_fingerprint: str,
    vocab_size: int,
    pad_id: int,
    eos_id: int | None,
) -> BuildInfo:
    """What the manifest records about the build besides its shards."""
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
    return BuildInfo(
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
