"""Whole-sequence items (``cp_size == 1``) built a chunk at a time, for :class:`loaders.PackedDataset`.

Building items one by one costs tens of µs of numpy calls each; here every array of a chunk of items is made
by one numpy pass from the build's segment index, and the arrays are reused once no item holds them.
Deterministic: the items equal :meth:`loaders.PackedDataset.item`'s, whatever the chunk.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

from mixing.shards import ShardSet

__all__ = ["IGNORE_INDEX", "ChunkBuilder"]

IGNORE_INDEX = -100


class ChunkBuilder:
    """Items of a local :class:`~mixing.shards.ShardSet` (its whole segment index is loaded once)."""

    def __init__(self, shards: ShardSet) -> None:
        m = shards.manifest
        self.shards, self.S = shards, int(m["seq_len"])
        self._arange = torch.arange(self.S, dtype=torch.int64)
        self._pool: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._plain: dict[int, np.ndarray] = {}
        self._first = np.array([int(sh["first_sequence"]) for sh in m["shards"]], dtype=np.int64)

    def build(self, seqs: list[int]) -> list[dict[str, Any]]:
        """Global sequences ``seqs`` as whole-sequence items: ``input_ids``, ``labels``, ``position_ids``,
        ``indices``, ``cu_seqlens``, ``cu_seqlens_padded``, ``step`` (the build's), ``sequence``.

        One numpy pass per array over all of them: ``input_ids``, ``labels`` and ``position_ids`` of item
        ``k`` are row ``k`` of one [len(seqs), S] int64 block each (views; the block lives as long as any
        of them), ``indices`` is one shared ``arange(S)`` tensor: treat items as read-only.
        """
        S, n = self.S, len(seqs)
        idx = np.asarray(seqs, dtype=np.int64)
        shard = np.searchsorted(self._first, idx, side="right") - 1
        tokens, labels, positions = self._block(n)
        stored = [self._stored(int(k)) for k in shard]
        for k in range(n):  # one copy per row (no gathered temporary), converting to int64 on the way
            tokens[k] = stored[k][idx[k] - self._first[shard[k]]]
        # segment lengths of every item back to back, each item's padding (if any) as one more segment
        offs, segs = self.shards.segments
        lo, n_real = offs[idx], offs[idx + 1] - offs[idx]
        used = self.shards.seq_tokens[idx]
        n_seg = n_real + (used < S)
        first = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(n_seg, out=first[1:])
        seg = np.empty(int(first[-1]), dtype=np.int64)
        seg[first[1:] - 1] = S - used  # the last entry of each item: its padding, overwritten when it has none
        item_of = np.repeat(np.arange(n), n_real)
        e = np.arange(len(item_of)) - np.repeat(np.cumsum(n_real) - n_real, n_real)  # index inside its item
        seg[first[item_of] + e] = segs[lo[item_of] + e, 3]
        cu = np.zeros(len(seg) + 1, dtype=np.int64)
        np.cumsum(seg, out=cu[1:])
        labels[:, :-1] = tokens[:, 1:]
        labels.reshape(-1)[cu[1:] - 1] = IGNORE_INDEX  # the last token of each document predicts nothing
        for row in np.flatnonzero(used < S).tolist():
            labels[row, used[row] :] = IGNORE_INDEX
        positions.fill(1)
        positions[cu[1:-1]] = 1 - seg[:-1]  # the running count restarts at 0 at every segment start
        positions[0] = 0
        np.cumsum(positions, out=positions)
        # each item's own cu_seqlens (k+1 entries, from 0): item k's boundaries minus k·S, side by side
        owner = np.repeat(np.arange(n), n_seg + 1)
        src = np.arange(len(owner)) - owner  # entry e of item k is boundary first[k] + e of the flat cu
        cu32 = torch.from_numpy((cu[src] - owner * S).astype(np.int32))
        steps = self.shards.steps[idx].tolist()
        x = torch.from_numpy(tokens).unbind(0)
        y = torch.from_numpy(labels).unbind(0)
        pos = torch.from_numpy(positions.reshape(n, S)).unbind(0)
        cus = torch.split(cu32, (n_seg + 1).tolist())
        return [
            {
                "input_ids": x[k],
                "labels": y[k],
                "position_ids": pos[k],
                "indices": self._arange,
                "cu_seqlens": cus[k],
                "cu_seqlens_padded": cus[k],
                "step": steps[k],
                "sequence": seqs[k],
            }
            for k in range(n)
        ]

    def _stored(self, k: int) -> np.ndarray:
        """Shard ``k``'s tokens as a plain ndarray over its memory map (row access without memmap's overhead)."""
        if k not in self._plain:
            self._plain[k] = np.asarray(self.shards.shard_tokens(k))
        return self._plain[k]

    def _block(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token, label ([n, S]) and flat position ([n·S]) int64 arrays for one chunk of ``n`` items.

        Fresh multi-megabyte arrays cost a page fault per 4 KiB on every chunk (the allocator maps them
        anew each time), more than the work itself; so a few blocks are kept and one is handed out again
        once no tensor of its earlier items is alive (CPython's reference count says so exactly: each
        item's tensors keep their block referenced).
        """
        S = self.S
        for trio in self._pool:
            # 3 = the pool's tuple + the loop variable's tuple access + getrefcount's own argument
            if len(trio[0]) >= n and all(sys.getrefcount(a) <= 3 for a in trio):
                return trio[0][:n], trio[1][:n], trio[2][: n * S]
        trio = (np.empty((n, S), np.int64), np.empty((n, S), np.int64), np.empty(n * S, np.int64))
        if len(self._pool) < 4:  # bounded: a consumer that keeps every item gets fresh arrays
            self._pool.append(trio)
        return trio
