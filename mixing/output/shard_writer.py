"""Writing a shard folder (the format :mod:`contract.shards` describes): shards first, the manifest last.

Every file is written under a temporary name and renamed (local: ``os.replace``; object stores: the object
appears whole on upload). The old manifest is removed before the first shard is written, so a folder whose
build was interrupted has no manifest and no reader trusts it; rerunning completes it.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from contract.cost import CostModel
from contract.digests import DIGEST_BYTES, sequence_digests, step_digests, write_step_digests
from contract.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    BuildInfo,
    Manifest,
    ShardEntry,
    ShardFile,
    ShardFiles,
    validated,
    write_manifest,
)
from contract.store import Store

__all__ = ["TokenSource", "open_shards", "seal_shards", "token_dtype", "write_shard", "write_shards"]

TokenSource = Callable[[int, int], np.ndarray]  # (lo, hi) -> tokens [hi - lo, S] of those sequences


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """uint16 when every id (0..vocab_size-1) fits, else uint32."""
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def _ours(name: str) -> bool:
    return name.startswith("shard-") or (name.startswith(".") and name.endswith(".tmp"))


def open_shards(out_dir: Path | str, storage_options: dict[str, Any] | None = None) -> Store:
    """The shard folder ``out_dir``, made ready for a new build: its manifest removed first (from here on no reader
    trusts it), then what killed writers left (``.NAME.*.tmp``)."""
    store = Store(out_dir, storage_options)
    if store.local:
        store.path.mkdir(parents=True, exist_ok=True)
    store.remove(MANIFEST)
    for name in store.names():
        if name.startswith(".") and name.endswith(".tmp"):
            store.remove(name)
    return store


def write_shard(
    store: Store,
    k: int,
    first: int,
    block: np.ndarray,
    step: np.ndarray,
    seg_offsets: np.ndarray,
    segments: np.ndarray,
    cost: CostModel,
) -> ShardEntry:
    """Write shard ``k``: ``block`` [n, S] of tokens (sequences ``first..first+n-1``), with their ``step`` [n],
    ``seg_offsets`` [n+1] (from 0) into ``segments`` [m, 4]; return its manifest entry. A function of its
    arguments only: whichever process writes shard ``k`` writes the same bytes."""
    block = np.ascontiguousarray(block)
    lengths = np.asarray(segments[:, 3], np.int64)
    off = np.asarray(seg_offsets, np.int64)
    cum = np.concatenate([[0], np.cumsum(lengths)])
    meta = {
        "step": np.asarray(step, np.int64),
        "seg_offsets": off,
        "segments": np.asarray(segments, np.int64),
        "seg_cost": cost.of(lengths),
        "seq_tokens": (cum[off[1:]] - cum[off[:-1]]).astype(np.int64),
        "seq_cost": cost.sequences(off, lengths),
    }
    files = ShardFiles(
        tokens=ShardFile(**store.put(f"shard-{k:05d}.tokens.npy", partial(_write_npy, block))),
        meta=ShardFile(**store.put(f"shard-{k:05d}.meta.npz", _npz_bytes(meta))),
    )
    return ShardEntry(first_sequence=first, sequences=len(block), files=files)


def seal_shards(
    store: Store,
    info: BuildInfo,
    shards: list[ShardEntry],
    sequences_per_step: int | None,
    seq_len: int,
    dtype: Any,
    format_version: int = FORMAT_VERSION,
) -> Manifest:
    """Write the manifest of ``shards`` (in order; ``sequences_per_step``: the sequences every step has, or
    None where steps differ) last, then remove shard files of older builds that it does not list; return it.
    ``format_version``: :data:`~contract.manifest.CONTINUATION_FORMAT` for a continuation."""
    n = sum(s.sequences for s in shards)
    full = Manifest.model_validate(
        {
            **{name: getattr(info, name) for name in info.model_fields_set & set(BuildInfo.model_fields)},
            "format_version": format_version,
            "seq_len": int(seq_len),
            "sequences": n,
            "sequences_per_step": sequences_per_step if n else None,
            "dtype": str(np.dtype(dtype)),
            "shards": tuple(shards),
        }
    )
    full = write_manifest(store.url, full, store.storage_options)
    keep = {f.name for s in shards for f in s.files.both()} | {MANIFEST}
    keep |= {info.step_digests.name} if info.step_digests is not None else set()
    for name in store.names():
        if _ours(name) and name not in keep:
            store.remove(name)
    return full


def write_shards(
    out_dir: Path | str,
    tokens: np.ndarray | TokenSource,
    step: np.ndarray,
    seg_offsets: np.ndarray,
    segments: np.ndarray,
    shard_sequences: int,
    info: BuildInfo | dict[str, Any],
    *,
    seq_len: int | None = None,
    storage_options: dict[str, Any] | None = None,
    on_shard: Callable[[int], None] = lambda _k: None,
) -> Manifest:
    """Write sequences with their metadata as shards into ``out_dir`` (path or URL), then the manifest.

    ``tokens`` is an array [n, S] or a function (lo, hi) → array [hi-lo, S] (so callers can gather one
    shard at a time); ``n = len(step)``. ``info``: what the caller records about the build
    (:class:`~contract.manifest.BuildInfo`, or a dict of its fields, validated before anything is
    written); each segment's and sequence's cost comes from its ``cost`` model. This adds the format fields
    and the shard list, writes the manifest last, removes shard files of older builds, and returns the
    manifest. ``on_shard(k)`` runs after shard ``k``. (:func:`write_shard` and :func:`seal_shards` are the
    two halves, for writers that spread the shards over several processes.)
    """
    info = validated(BuildInfo, info, f"{out_dir}/{MANIFEST}")
    store = open_shards(out_dir, storage_options)
    n = len(step)
    take: TokenSource = (lambda lo, hi: tokens[lo:hi]) if isinstance(tokens, np.ndarray) else tokens
    shards: list[ShardEntry] = []
    digests = [np.zeros((0, DIGEST_BYTES), np.uint8)]
    dtype: Any = np.uint16
    for k, lo in enumerate(range(0, n, shard_sequences)):
        hi = min(n, lo + shard_sequences)
        block = take(lo, hi)
        seq_len, dtype = block.shape[1], block.dtype
        s0, s1 = int(seg_offsets[lo]), int(seg_offsets[hi])
        off = seg_offsets[lo : hi + 1] - s0
        shards.append(write_shard(store, k, lo, block, step[lo:hi], off, segments[s0:s1], info.cost))
        digests.append(sequence_digests(block, off, segments[s0:s1, 3]))
        on_shard(k)
    per_step = np.unique(np.asarray(step), return_counts=True)[1]
    uniform = int(per_step[0]) if len(per_step) and (per_step == per_step[0]).all() else None
    n_steps = info.steps if info.steps is not None else (int(np.max(step)) + 1 if n else 0)
    entry = write_step_digests(store, step_digests(np.asarray(step), np.concatenate(digests), n_steps))
    info = info.model_copy(update={"step_digests": entry})
    return seal_shards(store, info, shards, uniform, int(seq_len or 0), dtype)


def _write_npy(arr: np.ndarray, f: BinaryIO) -> None:
    np.save(f, arr)


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()
