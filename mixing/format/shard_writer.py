"""Writing a shard folder (the format :mod:`mixing.format.shards` describes): shards first, the manifest last.

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

from mixing.format.manifest import (
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
from mixing.format.store import Store

__all__ = ["TokenSource", "token_dtype", "write_shards"]

TokenSource = Callable[[int, int], np.ndarray]  # (lo, hi) -> tokens [hi - lo, S] of those sequences


def token_dtype(vocab_size: int) -> type[np.unsignedinteger]:
    """uint16 when every id (0..vocab_size-1) fits, else uint32."""
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def _ours(name: str) -> bool:
    return name.startswith("shard-") or (name.startswith(".") and name.endswith(".tmp"))


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
    (:class:`~mixing.format.manifest.BuildInfo`, or a dict of its fields, validated before anything is
    written); each segment's and sequence's cost comes from its ``cost`` model. This adds the format fields
    and the shard list, writes the manifest last, removes shard files of older builds, and returns the
    manifest. ``on_shard(k)`` runs after shard ``k``.
    """
    info = validated(BuildInfo, info, f"{out_dir}/{MANIFEST}")
    store = Store(out_dir, storage_options)
    if store.local:
        store.path.mkdir(parents=True, exist_ok=True)
    store.remove(MANIFEST)  # the old build is no longer valid from here on
    for name in store.names():
        if name.startswith(".") and name.endswith(".tmp"):
            store.remove(name)  # left by a writer that was killed
    n = len(step)
    take: TokenSource = (lambda lo, hi: tokens[lo:hi]) if isinstance(tokens, np.ndarray) else tokens
    cum_tok = np.concatenate([[0], np.cumsum(segments[:, 3])])
    shards: list[ShardEntry] = []
    dtype = None
    for k, lo in enumerate(range(0, n, shard_sequences)):
        hi = min(n, lo + shard_sequences)
        block = np.ascontiguousarray(take(lo, hi))
        seq_len, dtype = block.shape[1], block.dtype
        s0, s1 = int(seg_offsets[lo]), int(seg_offsets[hi])
        off = seg_offsets[lo : hi + 1]
        lengths = np.asarray(segments[s0:s1, 3], np.int64)
        meta = {
            "step": np.asarray(step[lo:hi], np.int64),
            "seg_offsets": np.asarray(off - s0, np.int64),
            "segments": np.asarray(segments[s0:s1], np.int64),
            "seg_cost": info.cost.of(lengths),
            "seq_tokens": (cum_tok[off[1:]] - cum_tok[off[:-1]]).astype(np.int64),
            "seq_cost": info.cost.sequences(off - s0, lengths),
        }
        files = ShardFiles(
            tokens=ShardFile(**store.put(f"shard-{k:05d}.tokens.npy", partial(_write_npy, block))),
            meta=ShardFile(**store.put(f"shard-{k:05d}.meta.npz", partial(_write_bytes, _npz_bytes(meta)))),
        )
        shards.append(ShardEntry(first_sequence=lo, sequences=hi - lo, files=files))
        on_shard(k)
    steps = np.asarray(step)
    per_step = np.unique(steps, return_counts=True)[1] if n else np.zeros(0, np.int64)
    full = Manifest.model_validate(
        {
            **{name: getattr(info, name) for name in info.model_fields_set & set(BuildInfo.model_fields)},
            "format_version": FORMAT_VERSION,
            "seq_len": int(seq_len if seq_len is not None else 0),
            "sequences": n,
            "sequences_per_step": int(per_step[0]) if len(per_step) and (per_step == per_step[0]).all() else None,
            "dtype": str(np.dtype(dtype if dtype is not None else np.uint16)),
            "shards": tuple(shards),
        }
    )
    full = write_manifest(out_dir, full, storage_options)
    keep = {f.name for s in shards for f in s.files.both()} | {MANIFEST}
    for name in store.names():
        if _ours(name) and name not in keep:
            store.remove(name)
    return full


def _write_npy(arr: np.ndarray, f: BinaryIO) -> None:
    np.save(f, arr)


def _write_bytes(data: bytes, f: BinaryIO) -> None:
    f.write(data)


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()
