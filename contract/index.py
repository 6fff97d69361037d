"""A build's index: every shard's per-sequence and per-segment metadata concatenated into plain ``.npy`` files.

The shards' ``meta.npz`` files are zip archives: a reader must copy them into its own memory, and a reader
that wants all sequences (a loader's planner and chunk builder) concatenates them, privately, in every
process (about 90 bytes per segment). The index holds the same arrays once, uncompressed, so that every
process memory-maps them (``np.load(mmap_mode="r")``): the page cache holds one copy per node, shared by all
ranks and their workers, and opening costs no more than mapping the files.

Files in an index folder (n sequences, m segments; ``name.npy`` each):

- ``step`` int64 [n], ``seq_tokens`` int64 [n], ``seq_cost`` float64 [n]: as in the shards' metadata;
- ``seg_offsets`` int64 [n+1] and ``segments`` int64 [m, 4], ``seg_cost`` float64 [m]: global, sequence ``i``'s
  segments are ``segments[seg_offsets[i]:seg_offsets[i+1]]``;
- ``cu_seqlens`` int32 and ``cu_offsets`` int64 [n+1]: each sequence's document boundaries with its trailing
  padding (if any) as one more segment, back to back: sequence ``i``'s are
  ``cu_seqlens[cu_offsets[i]:cu_offsets[i+1]]`` (what a loader item's ``cu_seqlens`` holds);
- ``item_segments`` int64 [c−n, 3] (c: rows of ``cu_seqlens``): aligned with those boundaries, each sequence's
  segments' (source index, doc_id, start) and, where it has trailing padding, a row of -1: sequence ``i``'s
  are ``item_segments[cu_offsets[i] - i : cu_offsets[i+1] - i - 1]`` (what a loader item's ``segments`` holds);
- ``index.json``, written last: ``index_version``, ``manifest_sha256`` (the sha256 of the manifest's bytes the
  index was made from), ``meta_verified`` and per file its ``bytes`` and ``sha256``.

:func:`write_index` builds it one shard at a time (memory: one shard's metadata), whatever the shards'
format version (1–3); :func:`map_index` maps it. Where the index lives and who checks it is the reader's
business (``loaders.index`` keeps one per node).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from contract.store import sha256_file

if TYPE_CHECKING:
    from contract.shards import ShardSet

__all__ = ["ARRAYS", "INDEX", "INDEX_VERSION", "item_cu_seqlens", "item_segments", "map_index", "write_index"]

INDEX = "index.json"
INDEX_VERSION = 2  # 2: item_segments
# name → (dtype, shape after the first axis)
ARRAYS: dict[str, tuple[type, tuple[int, ...]]] = {
    "step": (np.int64, ()),
    "seq_tokens": (np.int64, ()),
    "seq_cost": (np.float64, ()),
    "seg_offsets": (np.int64, ()),
    "segments": (np.int64, (4,)),
    "seg_cost": (np.float64, ()),
    "cu_seqlens": (np.int32, ()),
    "cu_offsets": (np.int64, ()),
    "item_segments": (np.int64, (3,)),
}
_HEADER = 128  # bytes of each file's .npy header, fixed so that it can be written once the length is known


def item_cu_seqlens(
    seg_offsets: np.ndarray, lengths: np.ndarray, used: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Each sequence's boundaries with its trailing padding as one more segment, back to back (int32), and
    how many each has (int64 [n]); ``seg_offsets`` [n+1] into ``lengths`` [m], ``used`` real tokens [n]."""
    n_real = np.diff(seg_offsets)
    count = n_real + (used < seq_len) + 1
    head = np.cumsum(count) - count
    flat = np.zeros(int(count.sum()), dtype=np.int64)
    item = np.repeat(np.arange(len(n_real)), n_real)
    inner = np.arange(len(item)) - np.repeat(seg_offsets[:-1] - seg_offsets[0], n_real)
    flat[head[item] + 1 + inner] = lengths[seg_offsets[0] + np.arange(len(item))]
    padded = np.flatnonzero(used < seq_len)
    flat[head[padded] + count[padded] - 1] = seq_len - used[padded]
    run = np.cumsum(flat)
    return (run - np.repeat(run[head], count)).astype(np.int32), count


def item_segments(seg_offsets: np.ndarray, segments: np.ndarray, used: np.ndarray, seq_len: int) -> np.ndarray:
    """Each sequence's segments' first three columns, then a row of -1 where it has trailing padding, back to
    back (int64 [Σ segments + padded sequences, 3]): aligned with :func:`item_cu_seqlens`' boundaries;
    ``seg_offsets`` [n+1] into ``segments`` [m, 4], ``used`` real tokens [n]."""
    n_real = np.diff(seg_offsets)
    count = n_real + (used < seq_len)
    head = np.cumsum(count) - count
    out = np.full((int(count.sum()), 3), -1, dtype=np.int64)
    item = np.repeat(np.arange(len(n_real)), n_real)
    inner = np.arange(len(item)) - np.repeat(seg_offsets[:-1] - seg_offsets[0], n_real)
    out[head[item] + inner] = segments[seg_offsets[0] : seg_offsets[-1], :3]
    return out


class _Appender:
    """An ``.npy`` file written in pieces along its first axis; the header is written by :meth:`close`."""

    def __init__(self, path: Path, dtype: type, tail: tuple[int, ...]) -> None:
        self.path, self.dtype, self.tail, self.rows = path, np.dtype(dtype), tail, 0
        self.f: BinaryIO = path.open("wb")
        self.f.write(b"\0" * _HEADER)

    def add(self, arr: np.ndarray) -> None:
        a = np.ascontiguousarray(arr, dtype=self.dtype)
        assert a.shape[1:] == self.tail, (self.path, a.shape)
        self.f.write(a.tobytes())
        self.rows += len(a)

    def close(self) -> None:
        d = {
            "descr": np.lib.format.dtype_to_descr(self.dtype),
            "fortran_order": False,
            "shape": (self.rows, *self.tail),
        }
        body = repr(d).encode("latin1")
        room = _HEADER - 10 - 1  # magic (6) + version (2) + header length (2); the header ends in a newline
        assert len(body) <= room
        self.f.seek(0)
        self.f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", _HEADER - 10) + body.ljust(room) + b"\n")
        self.f.close()


def write_index(shards: ShardSet, folder: Path, manifest_sha256: str, meta_verified: bool) -> dict[str, Any]:
    """Write the index of ``shards`` into the existing, empty ``folder`` (``index.json`` last) and return
    what ``index.json`` holds. Reads each shard's metadata once through ``shards`` (validated as any read)."""
    seq_len = shards.manifest.seq_len
    out = {name: _Appender(folder / f"{name}.npy", dtype, tail) for name, (dtype, tail) in ARRAYS.items()}
    try:
        out["seg_offsets"].add(np.zeros(1))
        out["cu_offsets"].add(np.zeros(1))
        seg_base = cu_base = 0
        for k in range(len(shards.manifest.shards)):
            meta = shards.shard_meta(k)
            off, segs = meta["seg_offsets"], meta["segments"]
            for name in ("step", "seq_tokens", "seq_cost", "segments", "seg_cost"):
                out[name].add(meta[name])
            out["seg_offsets"].add(off[1:] + seg_base)
            cu, count = item_cu_seqlens(off, segs[:, 3], meta["seq_tokens"], seq_len)
            out["cu_seqlens"].add(cu)
            out["cu_offsets"].add(np.cumsum(count) + cu_base)
            out["item_segments"].add(item_segments(off, segs, meta["seq_tokens"], seq_len))
            seg_base, cu_base = seg_base + len(segs), cu_base + len(cu)
    finally:
        for a in out.values():
            a.close()
    files = {}
    for name in ARRAYS:
        path = folder / f"{name}.npy"
        files[name] = {"name": path.name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}
    record = {
        "index_version": INDEX_VERSION,
        "manifest_sha256": manifest_sha256,
        "meta_verified": meta_verified,
        "files": files,
    }
    (folder / INDEX).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def map_index(folder: Path, sequences: int) -> dict[str, np.ndarray]:
    """The arrays of the index in ``folder``, memory-mapped read-only (plain ndarray views of the maps).

    Raises ``ValueError`` when a file is unreadable or its dtype or shape does not fit ``sequences`` and the
    other arrays (what is in the files is the checksum's business, not this function's).
    """
    arrays: dict[str, np.ndarray] = {}
    for name, (dtype, tail) in ARRAYS.items():
        try:
            arr = np.load(folder / f"{name}.npy", mmap_mode="r", allow_pickle=False)
        except Exception as e:  # whatever numpy trips on
            raise ValueError(f"{folder / name}.npy: not a readable .npy file ({e})") from None
        if arr.dtype != np.dtype(dtype) or arr.shape[1:] != tail:
            raise ValueError(f"{folder / name}.npy: holds {arr.dtype} {arr.shape}, expected {np.dtype(dtype)}")
        arrays[name] = np.asarray(arr)
    n, m, c = sequences, len(arrays["segments"]), len(arrays["cu_seqlens"])
    want = {"step": n, "seq_tokens": n, "seq_cost": n, "seg_offsets": n + 1, "seg_cost": m, "cu_offsets": n + 1}
    for name, rows in want.items():
        if len(arrays[name]) != rows:
            raise ValueError(f"{folder / name}.npy: {len(arrays[name])} rows, expected {rows}")
    if len(arrays["item_segments"]) != c - n:
        raise ValueError(f"{folder / 'item_segments'}.npy: {len(arrays['item_segments'])} rows, expected {c - n}")
    if arrays["seg_offsets"][-1] != m or arrays["cu_offsets"][-1] != c:
        raise ValueError(f"{folder}: the offsets do not end at the arrays' lengths")
    return arrays
