"""Materialize a packing as shards: gather each sequence's tokens from the sources' chunks, record the build.

The shards are independent work items (:class:`ShardJob`): each carries its sequences' segments and where
each segment's tokens are (chunk, first token), and :func:`write_shard_job` gathers them from the build
root and writes the shard's two files there. The engine (:mod:`mixing.engine`) runs them: in this process,
or as Ray tasks in parallel. The driver writes the manifest last, listing every shard with its checksums.
A job is a function of the plan alone, so every engine writes the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl

from contract.cost import CostModel
from contract.digests import (
    DIGEST_BYTES,
    compute_step_digests,
    read_step_digests,
    sequence_digests,
    step_digests,
    write_step_digests,
)
from contract.manifest import CONTINUATION_FORMAT, FORMAT_VERSION, BuildInfo, Manifest, ShardEntry
from contract.record import FeedbackNote, PackingNote, PhaseSpan, Regroup, SourceCounts
from contract.store import Store
from mixing.continuation import Base
from mixing.engine import LOCAL, Engine
from mixing.ingest.chunk_store import ChunkTokens
from mixing.mixfile.mix import Mix
from mixing.output.layout import BuildLayout
from mixing.output.shard_writer import open_shards, seal_shards, token_dtype, write_shard
from mixing.pack.locations import Locations
from mixing.pack.result import PackedStep, PackStream

__all__ = ["ShardContext", "ShardJob", "WrittenShard", "write_packed", "write_shard_job"]

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


@dataclass(frozen=True)
class WrittenShard:
    """A written shard's manifest ``entry``, its sequences' ``step`` int64 [n] and ``digests`` uint8 [n, 16]
    (:func:`contract.digests.sequence_digests`), from which the driver makes the step digests."""

    entry: ShardEntry
    step: np.ndarray
    digests: np.ndarray


def write_shard_job(ctx: ShardContext, job: ShardJob) -> WrittenShard:
    """Gather shard ``job``'s tokens from the chunks and write its files to ``ctx.shards_url``; what it wrote."""
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
    entry = write_shard(store, job.k, job.first, block, job.step, job.seg_offsets, job.segments, ctx.cost)
    return WrittenShard(entry, job.step, sequence_digests(block, job.seg_offsets, lengths))


@dataclass
class _Tally:
    """Per source, what the stream packed and dropped (int64 [k] each), and the dropped units themselves."""

    tokens_packed: np.ndarray
    tokens_dropped: np.ndarray
    dropped: list[np.ndarray]


def _jobs(
    stream: PackStream, where: Locations, per_shard: int, tally: _Tally, k: int = 0, first: int = 0
) -> Iterator[ShardJob]:
    """The shard jobs of ``stream`` in order, ``per_shard`` sequences each (the last may have fewer), made as
    the stream is read: at most one shard's sequences are held. Counts into ``tally`` as it goes. The first is
    shard ``k`` holding global sequence ``first`` on (a continuation's follow its base's)."""
    held: list[PackedStep] = []
    n_held = 0
    for out in stream.steps:
        held.append(out)
        n_held += len(out.counts)
        np.add.at(tally.tokens_packed, out.segments[:, 0], out.segments[:, 3])
        if len(out.dropped):
            np.add.at(tally.tokens_dropped, out.dropped[:, 0], out.dropped[:, 3])
            tally.dropped.append(out.dropped)
        while n_held >= per_shard:
            job, held = _cut(held, per_shard, k, first, where)
            yield job
            k, first, n_held = k + 1, first + per_shard, n_held - per_shard
    if n_held:
        yield _cut(held, n_held, k, first, where)[0]


def _cut(held: list[PackedStep], n: int, k: int, first: int, where: Locations) -> tuple[ShardJob, list[PackedStep]]:
    """Shard ``k``: the first ``n`` sequences of the steps ``held`` (and what is left of them). :func:`_jobs`
    cuts as soon as ``n`` sequences are held, so the cut falls in the last step held and what is left is of
    that step alone."""
    counts = np.concatenate([h.counts for h in held])
    step = np.concatenate([np.full(len(h.counts), h.step, np.int64) for h in held])
    segs = np.concatenate([h.segments for h in held])
    off = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    mine = segs[: off[n]]
    chunk, src = where.of(mine)
    job = ShardJob(k, first, step[:n], off[: n + 1], mine, chunk, src)
    rest = PackedStep(int(step[n]), counts[n:], segs[off[n] :], np.zeros((0, 4), np.int64)) if n < len(step) else None
    return job, [rest] if rest is not None else []


def write_packed(
    mix: Mix,
    layout: BuildLayout,
    stream: PackStream,
    tokenizer_fingerprint: str,
    vocab_size: int,
    pad_id: int,
    *,
    eos_id: int | None = None,
    on_shard: Callable[[int], None] = lambda _k: None,
    out: str | Path | None = None,
    storage_options: dict[str, Any] | None = None,
    engine: Engine = LOCAL,
    db_config: Mapping[str, str | int | bool] | None = None,
    base: Base | None = None,
) -> Manifest:
    """Gather each sequence's tokens from the sources' chunks and write shards plus manifest; return the manifest.

    ``stream`` is read once, as the shards are written (:func:`~mixing.pack.packing.stream_plan`): the
    driver holds the shards in flight and each document's location in a memory-mapped local table
    (:class:`~mixing.pack.locations.Locations`, under ``layout.root``), never the whole packing.

    Shards go to ``out`` (a folder or fsspec URL such as ``s3://bucket/prefix``; default the build's
    ``shards/``, at ``layout.url``), with ``storage_options`` for the filesystem (default the layout's). The
    shards are written by ``engine``; ``on_shard(k)`` runs in this process as shard ``k`` is done (any order).

    The manifest's ``per_source`` records, for each source: ``tokens_planned`` (Σ planned unit lengths),
    ``tokens_packed``, ``tokens_dropped`` (planned = packed + dropped) and ``documents_packed``, counted in
    DuckDB with the settings ``db_config`` (give the stream's: see :func:`~mixing.pack.packing.stream_plan`).
    The manifest's ``step_digests`` name a file of every step's digest (:mod:`contract.digests`).

    ``base``: a continuation's (the stream starts at its switch step, its sources in the base's order first):
    the base's shards of the steps before the switch are put in the shards folder as they are
    (:meth:`~mixing.continuation.Base.link_into`), listed first, with the base's digests of those steps;
    ``per_source`` then counts the base's tokens and documents before the switch as planned and packed.
    """
    options = storage_options if out is not None else layout.storage_options
    store = open_shards(out if out is not None else f"{layout.url}/shards", options)
    dtype = np.dtype(token_dtype(vocab_size)).name
    n_src = len(stream.sources)
    tally = _Tally(np.zeros(n_src, np.int64), np.zeros(n_src, np.int64), [])
    ours = set(mix.sources)
    index_files = [layout.source_dir(name) / "docs.parquet" if name in ours else None for name in stream.sources]
    shards: dict[int, ShardEntry] = {}
    written: dict[int, WrittenShard] = {}
    prefix = base.prefix() if base is not None else []
    first = base.seq_before if base is not None else 0
    if base is not None and np.dtype(base.manifest.dtype) != np.dtype(dtype):
        dtype = base.manifest.dtype  # the base's token arrays decide (the vocabulary is the base's)
    with Locations(layout.root / "locations.tmp", index_files) as where:
        ctx = ShardContext(
            shards_url=store.url,
            storage_options=store.storage_options,
            source_chunks=tuple(f"{layout.url}/sources/{name}/chunks" for name in stream.sources),
            chunk_options=layout.storage_options,
            chunk_keys=where.chunk_keys,
            seq_len=stream.seq_len,
            dtype=dtype,
            pad_id=pad_id,
            cost=mix.balance.cost.model(),
        )
        jobs = _jobs(stream, where, max(1, _SHARD_TOKENS // stream.seq_len), tally, len(prefix), first)
        for _i, done in engine.map(write_shard_job, jobs, ctx, "write_shard"):
            k = len(shards)
            shards[done.entry.first_sequence] = done.entry
            written[done.entry.first_sequence] = done
            on_shard(k)
    info = _build_info(mix, layout, stream, tally, tokenizer_fingerprint, vocab_size, pad_id, eos_id, db_config)
    ordered = [shards[f] for f in sorted(shards)]
    digests = _step_digests([written[f] for f in sorted(written)], mix.total_steps, base)
    if base is not None:
        base.link_into(store)
        feedback = mix.continues.feedback if mix.continues is not None else None
        info = _continued(info, base, stream.sources, stream.seq_len, feedback)
    info = info.model_copy(update={"step_digests": write_step_digests(store, digests)})
    version = CONTINUATION_FORMAT if base is not None else FORMAT_VERSION
    return seal_shards(store, info, prefix + ordered, stream.global_batch, stream.seq_len, dtype, version)


def _step_digests(written: list[WrittenShard], steps: int, base: Base | None) -> np.ndarray:
    """Every step's digest: the base's before its switch, then those of the shards ``written`` (in order)."""
    seq = [w.digests for w in written] or [np.zeros((0, DIGEST_BYTES), np.uint8)]
    step = [w.step for w in written] or [np.zeros(0, np.int64)]
    out = step_digests(np.concatenate(step), np.concatenate(seq), steps)
    if base is not None:
        past = read_step_digests(base.shards)
        out[: base.at] = (past if past is not None else compute_step_digests(base.shards))[: base.at]
    return out


def _continued(
    info: BuildInfo, base: Base, sources: tuple[str, ...], seq_len: int, feedback: FeedbackNote | None
) -> BuildInfo:
    """``info`` of a continuation: its lineage, and the base's tokens and documents before the switch counted
    in ``per_source`` as planned and packed (every source of ``sources``, removed ones included)."""
    used = base.used(seq_len)
    per_source = dict(info.per_source or {})
    for name in sources:
        c = per_source.get(name, SourceCounts(tokens_planned=0, tokens_packed=0, tokens_dropped=0, documents_packed=0))
        u = used.get(name)
        tokens, docs = (u.tokens, len(np.unique(u.keys >> 24))) if u is not None else (0, 0)
        per_source[name] = c.model_copy(
            update={
                "tokens_planned": c.tokens_planned + tokens,
                "tokens_packed": c.tokens_packed + tokens,
                "documents_packed": c.documents_packed + docs,
            }
        )
    return info.model_copy(update={"lineage": base.lineage(feedback), "per_source": per_source})


def _build_info(
    mix: Mix,
    layout: BuildLayout,
    stream: PackStream,
    tally: _Tally,
    tokenizer_fingerprint: str,
    vocab_size: int,
    pad_id: int,
    eos_id: int | None,
    db_config: Mapping[str, str | int | bool] | None,
) -> BuildInfo:
    """What the manifest records about the build besides its shards. Documents packed per source: those the
    plan drew, less those whose every planned unit was dropped (counted in DuckDB, which spills)."""
    dropped = np.concatenate(tally.dropped) if tally.dropped else np.zeros((0, 4), np.int64)
    with duckdb.connect(str(layout.duckdb), read_only=True, config=dict(db_config or {})) as con:
        planned = {
            name: (int(tokens), int(docs))
            for name, tokens, docs in con.sql(
                "SELECT source, sum(length)::BIGINT, count(DISTINCT doc_id)::BIGINT FROM plan_units GROUP BY 1"
            ).fetchall()
        }
        phases = con.sql(
            "SELECT phase, min(step)::BIGINT, count(DISTINCT step)::BIGINT FROM plan_quotas GROUP BY 1 ORDER BY 2"
        ).fetchall()
        con.register(
            "drops",
            pl.DataFrame(
                {"source": [stream.sources[i] for i in dropped[:, 0].tolist()], "doc_id": dropped[:, 1]},
                schema={"source": pl.String, "doc_id": pl.Int64},
            ).to_arrow(),
        )
        lost = dict(  # documents whose every planned unit was dropped
            con.sql(
                "WITH d AS (SELECT source, doc_id, count(*) AS n FROM drops GROUP BY ALL), "
                "p AS (SELECT source, doc_id, count(*) AS n FROM plan_units SEMI JOIN d USING (source, doc_id) "
                "GROUP BY ALL) SELECT d.source, count(*)::BIGINT FROM d JOIN p USING (source, doc_id) "
                "WHERE d.n = p.n GROUP BY 1"
            ).fetchall()
        )
    per_source = {}
    for k, name in enumerate(stream.sources):
        tokens, docs = planned.get(name, (0, 0))
        per_source[name] = SourceCounts(
            tokens_planned=tokens,
            tokens_packed=int(tally.tokens_packed[k]),
            tokens_dropped=int(tally.tokens_dropped[k]),
            documents_packed=docs - int(lost.get(name, 0)),
            documents_dropped=len(np.unique(dropped[dropped[:, 0] == k, 1])),
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
        sources=tuple(stream.sources),
        phases=tuple(PhaseSpan(phase=p, first_step=s, steps=c) for p, s, c in phases),
        per_source=per_source,
        packing=PackingNote(
            algorithm="best-fit-decreasing per step steered by per-source quota deficits, cost-aware ties, "
            "lookahead fill within phase"
        ),
    )
