"""Items built a chunk at a time from a local build, for :class:`loaders.PackedDataset` (any ``cp_size``).

Building items one by one costs tens of µs of numpy calls each; here every array of a chunk of items is made
by one numpy pass from the build's segment index (the CP split of all items' documents included, by
:func:`loaders.context_parallel.document_zigzag_many`, then one gather per array), only the requested
fields are computed, and the arrays are reused once no item holds them. Deterministic: the items equal
:meth:`loaders.PackedDataset.item`'s, whatever the chunk.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import torch

from loaders.context_parallel import document_zigzag_many, split
from loaders.fields import FIELDS, IGNORE_INDEX
from mixing.shards import ShardSet

__all__ = ["IGNORE_INDEX", "ChunkBuilder"]


class ChunkBuilder:
    """Items of a local :class:`~mixing.shards.ShardSet` (its whole segment index is loaded once), cut for
    CP rank ``cp_rank`` of ``cp_size`` by ``cp_split``, carrying ``fields`` (checked by the caller)."""

    def __init__(
        self,
        shards: ShardSet,
        fields: tuple[str, ...] = FIELDS,
        cp_size: int = 1,
        cp_rank: int = 0,
        cp_split: str = "zigzag",
        pad_id: int = 0,
    ) -> None:
        m = shards.manifest
        self.shards, self.S, self.fields = shards, int(m["seq_len"]), fields
        self.cp_size, self.cp_rank, self.pad_id = cp_size, cp_rank, pad_id
        self.zigzag = cp_size > 1 and cp_split == "zigzag"
        # the other splits take the same slots of every sequence (they depend on S only)
        fixed = np.arange(self.S, dtype=np.int64)
        if cp_size > 1 and not self.zigzag:
            fixed = split(np.array([self.S]), cp_size, cp_rank, cp_split)
        self._fixed, self._fixed_t = fixed, torch.from_numpy(fixed)
        self._pool: dict[str, list[np.ndarray]] = {}
        self._plain: dict[int, np.ndarray] = {}
        self._first = np.array([int(sh["first_sequence"]) for sh in m["shards"]], dtype=np.int64)

    def build(self, seqs: list[int]) -> list[dict[str, Any]]:
        """Global sequences ``seqs`` as items: the requested fields plus ``step`` (the build's), ``sequence``
        and ``num_tokens``, equal to :meth:`loaders.PackedDataset.item`'s.

        One numpy pass per array over all of them: each array field of item ``k`` is a view of one flat
        int64 block shared by the chunk (the block lives as long as any of them); ``indices`` is one shared
        tensor unless the split is per document: treat items as read-only.
        """
        S, n, want = self.S, len(seqs), self.fields
        N = n * S
        idx = np.asarray(seqs, dtype=np.int64)
        shard = np.searchsorted(self._first, idx, side="right") - 1
        rows = (idx - self._first[shard]).tolist()
        # the whole sequences back to back, then one slot more: what a CP padding slot (index -1) gathers
        tokens = self._take("tokens", N + 1)
        tokens[N] = self.pad_id
        block = tokens[:N].reshape(n, S)
        stored = [self._stored(k) for k in shard.tolist()]
        for k in range(n):  # one copy per row (no gathered temporary), converting to int64 on the way
            block[k] = stored[k][rows[k]]
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
        full = {"input_ids": tokens}
        if "labels" in want:
            labels = full["labels"] = self._take("labels", N + 1)
            labels[: N - 1] = tokens[1:N]
            labels[cu[1:] - 1] = IGNORE_INDEX  # the last token of each document predicts nothing
            labels[N] = IGNORE_INDEX
            for row in np.flatnonzero(used < S).tolist():
                labels[row * S + int(used[row]) : (row + 1) * S] = IGNORE_INDEX
        if "position_ids" in want:
            positions = full["position_ids"] = self._take("position_ids", N + 1)
            positions.fill(1)
            positions[cu[1:-1]] = 1 - seg[:-1]  # the running count restarts at 0 at every segment start
            positions[0] = 0
            np.cumsum(positions[:N], out=positions[:N])
            positions[N] = 0
        # each item's own cu_seqlens (k+1 entries, from 0): item k's boundaries minus k·S, side by side
        owner = np.repeat(np.arange(n), n_seg + 1)
        src = np.arange(len(owner)) - owner  # entry e of item k is boundary first[k] + e of the flat cu
        bounds = (n_seg + 1).tolist()
        cols: dict[str, list[Any]] = {}
        gather: np.ndarray | None  # flat positions of this rank's slots (N: the padding slot); None: all
        if self.zigzag:
            two = 2 * self.cp_size
            padded = -(-seg // two) * two
            rotation = np.arange(len(seg)) - np.repeat(first[:-1], n_seg)  # segment index inside its item
            flat = document_zigzag_many(seg, rotation, self.cp_size, self.cp_rank)
            sizes = np.add.reduceat(padded // self.cp_size, first[:-1]).tolist()
            pad = flat < 0
            gather = np.where(pad, N, flat)
            local = flat - np.repeat(np.arange(n) * S, sizes)
            local[pad] = -1
            if "indices" in want:
                cols["indices"] = list(torch.from_numpy(local).split(sizes))
            if "cu_seqlens_padded" in want:
                pcu = np.zeros(len(seg) + 1, dtype=np.int64)
                np.cumsum(padded, out=pcu[1:])
                pcu32 = torch.from_numpy((pcu[src] - pcu[first[owner]]).astype(np.int32))
                cols["cu_seqlens_padded"] = list(torch.split(pcu32, bounds))
        else:
            sizes = [len(self._fixed)] * n
            gather = (np.arange(n) * S)[:, None] + self._fixed[None, :] if self.cp_size > 1 else None
            if "indices" in want:
                cols["indices"] = [self._fixed_t] * n
        for name in ("input_ids", "labels", "position_ids"):
            if name in want:
                arr = full[name][:N]
                if gather is not None:  # CP: this rank's slots of every item, in one gather per array
                    out = self._take("cp_" + name, int(sum(sizes)))
                    arr = np.take(full[name], gather.reshape(-1), out=out, mode="clip")  # unbuffered
                cols[name] = list(torch.from_numpy(arr).split(sizes))
        if "cu_seqlens" in want or ("cu_seqlens_padded" in want and not self.zigzag):
            cus = list(torch.split(torch.from_numpy((cu[src] - owner * S).astype(np.int32)), bounds))
            if "cu_seqlens" in want:
                cols["cu_seqlens"] = cus
            if "cu_seqlens_padded" in want and not self.zigzag:
                cols["cu_seqlens_padded"] = cus
        cols["step"] = self.shards.steps[idx].tolist()
        cols["sequence"] = list(seqs)
        cols["num_tokens"] = used.tolist()
        keys = list(cols)
        return [dict(zip(keys, values, strict=True)) for values in zip(*cols.values(), strict=True)]

    def _stored(self, k: int) -> np.ndarray:
        """Shard ``k``'s tokens as a plain ndarray over its memory map (row access without memmap's overhead)."""
        if k not in self._plain:
            self._plain[k] = np.asarray(self.shards.shard_tokens(k))
        return self._plain[k]

    def _take(self, role: str, size: int) -> np.ndarray:
        """An int64 array of ``size`` for ``role`` (one per array a chunk makes), reused when free.

        Fresh multi-megabyte arrays cost a page fault per 4 KiB on every chunk (the allocator maps them
        anew each time), more than the work itself; so a few arrays per role are kept and one is handed out
        again once no tensor of its earlier items is alive (CPython's reference count says so exactly: each
        item's tensors keep the array referenced through their views' base).
        """
        pool = self._pool.setdefault(role, [])
        spare = -1
        for k in range(len(pool)):  # not enumerate: its cached result tuple would hold one reference more
            a = pool[k]
            # 3 = the pool's list + the local variable + getrefcount's own argument
            if sys.getrefcount(a) <= 3:
                if len(a) >= size:
                    return a[:size]
                spare = k
        fresh = np.empty(size + size // 4, dtype=np.int64)  # room for a chunk with more CP padding
        if spare >= 0:
            pool[spare] = fresh
        elif len(pool) < 4:  # bounded: a consumer that keeps every item gets fresh arrays
            pool.append(fresh)
        return fresh[:size]
