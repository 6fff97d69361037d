"""The packed shard format (version 2): memory-mappable token arrays plus per-sequence metadata.

A shard folder (a local path or any fsspec URL, e.g. ``s3://bucket/prefix``) holds, per shard ``k``:

- ``shard-{k:05d}.tokens.npy``: token ids [n, S], uint16 when the vocabulary fits, else uint32. Slots past
  a sequence's last segment are padding (``pad_id``). Memory-mapped when local.
- ``shard-{k:05d}.meta.npz``: ``step`` int64 [n]; ``seg_offsets`` int64 [n+1] into the segment arrays;
  ``segments`` int64 [m, 4] = (source index, doc_id, start, length) in order inside each sequence;
  ``seg_cost`` float64 [m] (cost model of the manifest); ``seq_tokens`` int64 [n]; ``seq_cost`` float64 [n].
  ``cu_seqlens`` of sequence j = [0, cumsum(segments[seg_offsets[j]:seg_offsets[j+1], 3])].
- ``manifest.json``, written **last**: ``format_version``, ``seq_len``, ``dtype``, ``sequences``,
  ``sequences_per_step``, the caller's fields (mix and tokenizer fingerprints, steps, sources, cost, ...)
  and ``shards``: per shard ``first_sequence``, ``sequences`` and its files with ``bytes`` and ``sha256``.

Every file is written under a temporary name and renamed (local: ``os.replace``; object stores: the object
appears whole on upload, then is moved). The old manifest is removed before the first shard is written,
so a folder whose build was interrupted has no manifest and no reader trusts it; rerunning completes it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property, partial
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from mixing.errors import WeirError
from mixing.store import Store, sha256_file

__all__ = [
    "FORMAT_VERSION",
    "SequenceView",
    "ShardError",
    "ShardSet",
    "sha256_file",
    "token_dtype",
    "write_shards",
]

FORMAT_VERSION = 2
_READABLE = (1, 2)  # version 1 lacks the cost and token arrays; they are derived on read

TokenSource = Callable[[int, int], np.ndarray]  # (lo, hi) -> tokens [hi - lo, S] of those sequences


class ShardError(WeirError, RuntimeError):
    """A missing manifest, a checksum mismatch, or a format this reader does not know."""


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
    manifest: dict[str, Any],
    *,
    seg_cost: np.ndarray | None = None,
    seq_len: int | None = None,
    storage_options: dict[str, Any] | None = None,
    on_shard: Callable[[int], None] = lambda _k: None,
) -> dict[str, Any]:
    """Write sequences with their metadata as shards into ``out_dir`` (path or URL), then the manifest.

    ``tokens`` is an array [n, S] or a function (lo, hi) → array [hi-lo, S] (so callers can gather one
    shard at a time); ``n = len(step)``. ``seg_cost`` float64 [m] defaults to the manifest's ``cost``
    model. ``manifest`` holds the caller's fields; this adds the format fields and the shard list, writes
    it last, removes shard files of older builds, and returns it. ``on_shard(k)`` runs after shard ``k``.
    """
    store = Store(out_dir, storage_options)
    if store.local:
        store.path.mkdir(parents=True, exist_ok=True)
    store.remove("manifest.json")  # the old build is no longer valid from here on
    for name in store.names():
        if name.startswith(".") and name.endswith(".tmp"):
            store.remove(name)  # left by a writer that was killed
    n = len(step)
    take: TokenSource = (lambda lo, hi: tokens[lo:hi]) if isinstance(tokens, np.ndarray) else tokens
    if seg_cost is None:
        att, lin = (float(manifest.get("cost", {}).get(k, d)) for k, d in (("attention", 1.0), ("linear", 0.0)))
        length = segments[:, 3].astype(np.float64)
        seg_cost = att * length * length + lin * length
    cum_tok = np.concatenate([[0], np.cumsum(segments[:, 3])])
    cum_cost = np.concatenate([[0.0], np.cumsum(seg_cost)])
    shards: list[dict[str, Any]] = []
    dtype = None
    for k, lo in enumerate(range(0, n, shard_sequences)):
        hi = min(n, lo + shard_sequences)
        block = np.ascontiguousarray(take(lo, hi))
        seq_len, dtype = block.shape[1], block.dtype
        s0, s1 = int(seg_offsets[lo]), int(seg_offsets[hi])
        off = seg_offsets[lo : hi + 1]
        meta = {
            "step": np.asarray(step[lo:hi], np.int64),
            "seg_offsets": np.asarray(off - s0, np.int64),
            "segments": np.asarray(segments[s0:s1], np.int64),
            "seg_cost": np.asarray(seg_cost[s0:s1], np.float64),
            "seq_tokens": (cum_tok[off[1:]] - cum_tok[off[:-1]]).astype(np.int64),
            "seq_cost": cum_cost[off[1:]] - cum_cost[off[:-1]],
        }
        files = {
            "tokens": store.put(f"shard-{k:05d}.tokens.npy", partial(_write_npy, block)),
            "meta": store.put(f"shard-{k:05d}.meta.npz", partial(_write_bytes, _npz_bytes(meta))),
        }
        shards.append({"first_sequence": lo, "sequences": hi - lo, "files": files})
        on_shard(k)
    steps = np.asarray(step)
    per_step = np.unique(steps, return_counts=True)[1] if n else np.zeros(0, np.int64)
    full = {
        **manifest,
        "format_version": FORMAT_VERSION,
        "seq_len": int(seq_len if seq_len is not None else 0),
        "sequences": n,
        "sequences_per_step": int(per_step[0]) if len(per_step) and (per_step == per_step[0]).all() else None,
        "dtype": str(np.dtype(dtype)) if dtype is not None else manifest.get("dtype", "uint16"),
        "shards": shards,
    }
    text = json.dumps(full, indent=2, sort_keys=True) + "\n"
    store.put("manifest.json", partial(_write_bytes, text.encode()))
    keep = {f["name"] for s in shards for f in s["files"].values()} | {"manifest.json"}
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


@dataclass(frozen=True)
class SequenceView:
    """One packed sequence: ``tokens`` [S], ``segments`` [k, 4] (source, doc_id, start, length), ``step``.

    ``seg_cost`` float64 [k]: each segment's cost under the manifest's cost model.
    """

    index: int
    step: int
    tokens: np.ndarray
    segments: np.ndarray
    seg_cost: np.ndarray | None = None

    @property
    def cu_seqlens(self) -> np.ndarray:
        """int32 [k+1]: document boundaries inside the sequence (padding, if any, not included)."""
        return np.concatenate([[0], np.cumsum(self.segments[:, 3])]).astype(np.int32)


class ShardSet:
    """Read-only access to a build's shards by global sequence index (local folder or fsspec URL).

    Local shards are memory-mapped lazily; remote ones are fetched whole on first use.
    ``dir`` is the folder as a ``Path`` (for URLs, ``url`` is the authority).
    """

    def __init__(self, shards_dir: Path | str, storage_options: dict[str, Any] | None = None) -> None:
        self._store = Store(shards_dir, storage_options)
        self.url = self._store.url
        self.dir = self._store.path
        try:
            self.manifest_bytes = self._store.read("manifest.json")
        except FileNotFoundError:
            raise ShardError(f"{self.url}: no manifest.json; the build is missing or did not finish") from None
        self.manifest: dict[str, Any] = json.loads(self.manifest_bytes)
        if self.manifest.get("format_version") not in _READABLE:
            raise ShardError(
                f"{self.url}/manifest.json: format_version {self.manifest.get('format_version')}; "
                f"this reader knows {list(_READABLE)}"
            )
        self._starts = np.array([s["first_sequence"] for s in self.manifest["shards"]], dtype=np.int64)
        self._open: dict[int, tuple[np.ndarray, dict[str, np.ndarray]]] = {}

    def __len__(self) -> int:
        return int(self.manifest["sequences"])

    @cached_property
    def steps(self) -> np.ndarray:
        """Step of every sequence, int64 [len(self)], non-decreasing."""
        return self._concat("step", np.int64)

    @cached_property
    def seq_cost(self) -> np.ndarray:
        """Cost of every sequence (Σ cost of its segments), float64 [len(self)]."""
        return self._concat("seq_cost", np.float64)

    @cached_property
    def seq_tokens(self) -> np.ndarray:
        """Real (non-padding) tokens of every sequence, int64 [len(self)]."""
        return self._concat("seq_tokens", np.int64)

    @cached_property
    def segments(self) -> tuple[np.ndarray, np.ndarray]:
        """All sequences' segments: (seg_offsets int64 [n+1], segments int64 [m, 4])."""
        offs, segs, base = [np.zeros(1, np.int64)], [np.zeros((0, 4), np.int64)], 0
        for k in range(len(self._starts)):
            meta = self._shard(k)[1]
            offs.append(meta["seg_offsets"][1:] + base)
            segs.append(meta["segments"])
            base += len(meta["segments"])
        return np.concatenate(offs), np.concatenate(segs)

    def _concat(self, key: str, dtype: type) -> np.ndarray:
        parts = [self._shard(k)[1][key] for k in range(len(self._starts))]
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    def _shard(self, k: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if k not in self._open:
            files = self.manifest["shards"][k]["files"]
            if self._store.local:
                tokens = np.load(self.dir / files["tokens"]["name"], mmap_mode="r")
            else:
                tokens = np.load(io.BytesIO(self._store.read(files["tokens"]["name"])))
            with np.load(io.BytesIO(self._store.read(files["meta"]["name"]))) as z:
                meta = {key: z[key] for key in z.files}
            if "seg_cost" not in meta:  # format 1
                c = self.manifest.get("cost", {})
                length = meta["segments"][:, 3].astype(np.float64)
                meta["seg_cost"] = c.get("attention", 1.0) * length**2 + c.get("linear", 0.0) * length
                off = meta["seg_offsets"]
                cum_t = np.concatenate([[0], np.cumsum(meta["segments"][:, 3])])
                cum_c = np.concatenate([[0.0], np.cumsum(meta["seg_cost"])])
                meta["seq_tokens"] = cum_t[off[1:]] - cum_t[off[:-1]]
                meta["seq_cost"] = cum_c[off[1:]] - cum_c[off[:-1]]
            self._open[k] = (tokens, meta)
        return self._open[k]

    def shard_tokens(self, k: int) -> np.ndarray:
        """Tokens of shard ``k``, [its sequences, S] (memory-mapped when local)."""
        return self._shard(k)[0]

    def sequence(self, i: int) -> SequenceView:
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} out of range [0, {len(self)})")
        k = int(np.searchsorted(self._starts, i, side="right") - 1)
        tokens, meta = self._shard(k)
        j = i - int(self._starts[k])
        a, b = meta["seg_offsets"][j], meta["seg_offsets"][j + 1]
        return SequenceView(i, int(meta["step"][j]), tokens[j], meta["segments"][a:b], meta["seg_cost"][a:b])

    def verify(self) -> list[str]:
        """Names of shard files whose size or sha256 differs from the manifest (empty when all are sound)."""
        bad = []
        for shard in self.manifest["shards"]:
            for f in shard["files"].values():
                if self._store.digest(f["name"]) != (f["bytes"], f["sha256"]):
                    bad.append(f["name"])
        return bad
