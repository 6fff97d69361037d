"""``ItemBuilder``: the items of a chunk of packed sequences, cut for one CP rank, for
:class:`loaders.PackedDataset`, from whichever feed gives their tokens and segments (:mod:`loaders.feed`: a
local build's index, or a streamed build's verified views), so that local and remote items are the same.

Building items one by one costs tens of µs of numpy calls each; here every array of a chunk of items is made
by one numpy pass (the CP split of all items' documents included, by
:func:`loaders.context_parallel.zigzag_runs`, then one gather per array), only the requested fields are
computed, and the arrays are reused once no item holds them. Deterministic: an item does not depend on the
chunk it was built in, nor on the feed.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from loaders.context_parallel import expand_runs, split, zigzag_runs
from loaders.feed import Feed, SegmentTable, feed_for
from loaders.fields import IGNORE_INDEX, check_fields
from loaders.world import World

if TYPE_CHECKING:
    from loaders.integrity import VerifiedShardSet

__all__ = ["ItemBuilder"]


class ItemBuilder:
    """Items of the sequences ``feed`` gives (``seq_len`` slots each, ``pad_id`` in padding), cut for the CP
    rank of ``world`` by ``cp_split``, carrying ``fields`` (checked by the caller, in
    :data:`~loaders.fields.FIELDS` order)."""

    def __init__(
        self, feed: Feed, *, seq_len: int, pad_id: int, fields: tuple[str, ...], world: World, cp_split: str
    ) -> None:
        self.feed, self.S, self.pad_id, self.fields = feed, seq_len, pad_id, fields
        self.cp_size, self.cp_rank = world.cp_size, world.cp_rank
        self.zigzag = world.cp_size > 1 and cp_split == "zigzag"
        # the other splits take the same slots of every sequence (they depend on S only)
        fixed = np.arange(self.S, dtype=np.int64)
        if world.cp_size > 1 and not self.zigzag:
            fixed = split(np.array([self.S]), world.cp_size, world.cp_rank, cp_split)
        self._fixed, self._fixed_t = fixed, torch.from_numpy(fixed)
        self._pool: dict[str, list[np.ndarray]] = {}
        self._lean = not self.zigzag and "labels" not in fields and "position_ids" not in fields
        self._narrow = np.uint16 if seq_len <= 2**16 else np.uint32  # holds every position (< S)
        self._ramp_of = np.zeros(0, self._narrow)

    @classmethod
    def whole(cls, shards: VerifiedShardSet, *, seq_len: int, pad_id: int, fields: Iterable[str]) -> ItemBuilder:
        """Items of whole sequences of ``shards`` (a world of one rank: no CP cut) carrying ``fields`` (checked
        here): what a loader that cuts the documents itself reads (the THD cut, the hybrid layout)."""
        return cls(
            feed_for(shards),
            seq_len=seq_len,
            pad_id=pad_id,
            fields=check_fields(fields, 1),
            world=World(),
            cp_split="zigzag",
        )

    def __getstate__(self) -> dict[str, Any]:
        # a spawned worker starts with no pooled arrays and makes its own ramp
        return {**self.__dict__, "_pool": {}, "_ramp_of": self._ramp_of[:0]}

    def build(self, seqs: list[int]) -> list[dict[str, Any]]:
        """Global sequences ``seqs`` as items: the requested fields plus ``step`` (the build's), ``sequence``
        and ``num_tokens`` (see :class:`loaders.PackedDataset` for what each holds; the provenance fields:
        :mod:`loaders.fields`).

        One numpy pass per array over all of them: each array field of item ``k`` is a view of one flat
        block shared by the chunk (int64; ``source_ids`` int32; the block lives as long as any of them; the
        ``segments`` are views of one small [m, 3] array per chunk); ``indices`` is one shared tensor unless the
        split is per document: treat items as read-only.
        """
        S, n, want = self.S, len(seqs), self.fields
        N = n * S
        # the whole sequences back to back, then one slot more: what a CP padding slot (index -1) gathers
        tokens = self._take("tokens", N + 1)
        tokens[N] = self.pad_id
        table, rows = self.feed.read(np.asarray(seqs, dtype=np.int64), tokens[:N].reshape(n, S))
        used = table.used[rows]
        cols: dict[str, list[Any]] = {}
        layout = None
        if self._lean and table.cu is not None:  # no labels, positions or per-document split: the index's cu
            cus = []
            if "cu_seqlens" in want or "cu_seqlens_padded" in want:
                cu_all, at = table.cu
                start = at.take(rows)
                count = at.take(rows + 1) - start  # ≥ 2 boundaries per item
                cus = _pieces(cu_all[_ranges(start, count)], count.tolist())
            sources = None
            if "source_ids" in want:  # the segments' lengths only for it (no labels or positions here)
                first, at, pad, seg, _ = layout = self._layout(table, rows, used)
                sources = self._source_ids(table, used, at, pad, seg)
            self._whole(cols, tokens, np.zeros(0, np.int64), np.zeros(0, np.int64), used, sources)
        else:
            first, at, pad, seg, cu = layout = self._layout(table, rows, used)
            sources = self._source_ids(table, used, at, pad, seg) if "source_ids" in want else None
            if self.zigzag:
                self._zigzag(cols, tokens, seg, first, cu, used, sources)
            else:
                self._whole(cols, tokens, seg, cu, used, sources)
            cus, pcus = self._item_cu(seg, first, cu)
            if self.zigzag and "cu_seqlens_padded" in want:
                cols["cu_seqlens_padded"] = pcus
        if "cu_seqlens" in want:
            cols["cu_seqlens"] = cus
        if "cu_seqlens_padded" in want and not self.zigzag:
            cols["cu_seqlens_padded"] = cus
        if "segments" in want:  # per segment: after the cu fields
            cols["segments"] = self._segments(table, rows, layout)
        cols["step"] = table.steps[rows].tolist()
        cols["sequence"] = list(seqs)
        cols["num_tokens"] = used.tolist()
        keys = list(cols)
        # every column has one entry per item (the strict zip checks it); zip mapped over the items, not called
        # per item with a keyword, which costs a fifth of the dicts' making
        return list(map(dict, map(zip, itertools.repeat(keys), zip(*cols.values(), strict=True))))

    def _layout(
        self, table: SegmentTable, rows: np.ndarray, used: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Segments of ``table``'s ``rows`` back to back, each one's padding (if any) as one more segment (m
        *entries* in all; ``used``: the rows' real tokens): ``first`` [n+1] (item k's entries are
        ``first[k]:first[k+1]``), ``at`` [m] (each entry's row of ``table``; 0 for a padding entry), ``pad``
        (the padding entries, ascending), then the entries' lengths ``seg`` [m] and boundaries ``cu`` [m+1] in
        the concatenated positions (item k starts at k·S). All int64."""
        # a few µs per chunk matter here: np.add.accumulate and the ndarray.repeat method, not np.cumsum and
        # np.repeat, whose Python wrappers cost about a µs each
        S, n = self.S, len(rows)
        lo = table.offsets[rows]
        padded = used < S
        n_seg = table.offsets[rows + 1] - lo + padded  # ≥ 1: a sequence holds a segment or is padding
        first = np.zeros(n + 1, dtype=np.int64)
        np.add.accumulate(n_seg, out=first[1:])
        # entry first[k] + e is row lo[k] + e: one shift per item over a count (cheaper than expand_runs'
        # fill, scatter and cumsum); a padding entry would get the row after its item's, which may not
        # exist, so it reads row 0 instead (whatever it reads is overwritten)
        at = (lo - first[:-1]).repeat(n_seg)
        at += np.arange(len(at))
        pad = (first[1:] - 1)[padded]
        at[pad] = 0
        # a table with no segment at all: every entry is padding
        seg = table.lengths[at] if len(table.lengths) else np.zeros(len(at), np.int64)
        seg[pad] = S - used[padded]
        cu = np.zeros(len(seg) + 1, dtype=np.int64)
        np.add.accumulate(seg, out=cu[1:])
        return first, at, pad, seg, cu

    def _segments(
        self, table: SegmentTable, rows: np.ndarray, layout: tuple[np.ndarray, ...] | None
    ) -> list[torch.Tensor]:
        """Each item's ``segments`` (int64 [k, 3], aligned with its ``cu_seqlens``: its segments in order, then a
        row of -1 for its trailing padding): from the index's ``item_segments`` (each row's, laid out already:
        one row gather), else from ``layout`` (a :meth:`_layout` of ``rows``: three column gathers of the
        table, which is the build index's memory map or a chunk's own)."""
        if table.item_segments is not None and table.cu is not None:
            # µs count here (this is provenance's cost on lean items): ndarray.take, a third of fancy
            # indexing's time for rows
            at = table.cu[1]
            start = at.take(rows)
            count = at.take(rows + 1) - start
            count -= 1  # item k's segments: one fewer than its boundaries
            start -= rows  # row r's segments begin at cu[1][r] - r in item_segments (one boundary more per row)
            return _pieces(table.item_segments.take(_ranges(start, count), axis=0), count.tolist())
        assert layout is not None, "a table without item_segments is laid out first"
        first, at, pad = layout[:3]
        cut = _whole_segments(table)
        # the three columns gathered one by one and stacked: a gather of three of the table's four columns row
        # by row costs ~3× more
        segs = np.stack([cut[:, c][at] for c in range(3)], axis=1)
        segs[pad] = -1
        return _pieces(segs, (first[1:] - first[:-1]).tolist())

    def _source_ids(
        self, table: SegmentTable, used: np.ndarray, at: np.ndarray, pad: np.ndarray, seg: np.ndarray
    ) -> np.ndarray:
        """The source of every concatenated position of the entries :meth:`_layout` laid out (``at``, ``pad``,
        ``seg``: each entry's row of ``table``, the padding entries, each entry's length; ``used``: the rows'
        real tokens): int32 [N + 1], -1 on padding and on the extra slot N that a CP padding slot gathers.

        One ``np.repeat`` over the positions, in a narrow type, and one copy into a pooled int32 array, viewed
        per item."""
        source = _whole_segments(table)[:, 0][at].astype(np.int32)
        source[pad] = -1
        # each segment's source over its slots, into a pooled array (a fresh one faults its pages in every
        # chunk): repeated in the narrowest type that holds the ids (a quarter of the bytes for < 128
        # sources), then widened by one casting copy
        N = int(used.size * self.S)
        ids = self._take("source_ids", N + 1, np.int32)
        top = int(np.maximum.reduce(source, initial=-1))  # the ufunc: ndarray.max wraps it in Python
        narrow = source.astype(np.int8 if top < 2**7 else np.int16 if top < 2**15 else np.int32)
        np.copyto(ids[:N], narrow.repeat(seg))
        ids[N] = -1  # what a CP padding slot gathers
        return ids

    def _item_cu(
        self, seg: np.ndarray, first: np.ndarray, cu: np.ndarray
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each item's ``cu_seqlens`` and zigzag-padded ``cu_seqlens_padded`` (int32 [k+1] from 0) from a
        :meth:`_layout` (the padded ones only under the per-document zigzag, else the same list)."""
        # methods and in-place operations: each numpy or torch Python wrapper skipped saves about a µs
        n = len(first) - 1
        count = first[1:] - first[:-1]
        count += 1  # item k's boundaries
        owner = np.arange(n).repeat(count)
        src = np.arange(len(owner))
        src -= owner  # entry e of item k is boundary first[k] + e of the flat cu
        bounds = count.tolist()
        flat = cu[src]
        flat -= owner * self.S
        cus = _pieces(flat.astype(np.int32), bounds)
        if not self.zigzag:
            return cus, cus
        two = 2 * self.cp_size
        pcu = np.zeros(len(seg) + 1, dtype=np.int64)
        np.add.accumulate(-(-seg // two) * two, out=pcu[1:])
        flat = pcu[src]
        flat -= pcu[first[owner]]
        return cus, _pieces(flat.astype(np.int32), bounds)

    def _whole(
        self,
        cols: dict[str, list[Any]],
        tokens: np.ndarray,
        seg: np.ndarray,
        cu: np.ndarray,
        used: np.ndarray,
        sources: np.ndarray | None = None,
    ) -> None:
        """``cols``' token-slot fields when every item has the same slots (``cp_size == 1``, or a split of
        fixed slots): labels and positions of the whole sequences, then one gather per array for CP;
        ``sources``: each position's source (:meth:`_provenance_fields`), when ``source_ids`` is asked."""
        S, n, want = self.S, len(used), self.fields
        N = n * S
        full = {"input_ids": tokens}
        if sources is not None:
            full["source_ids"] = sources
        if "labels" in want:
            labels = full["labels"] = self._take("labels", N + 1)
            labels[: N - 1] = tokens[1:N]
            labels[cu[1:] - 1] = IGNORE_INDEX  # the last token of each document predicts nothing
            labels[N] = IGNORE_INDEX
            for row in np.flatnonzero(used < S).tolist():
                labels[row * S + int(used[row]) : (row + 1) * S] = IGNORE_INDEX
        if "position_ids" in want:
            positions = full["position_ids"] = self._take("position_ids", N + 1)
            self._positions(positions[:N], cu[:-1], seg)  # each slot less its segment's start
            positions[N] = 0
        if "indices" in want:
            cols["indices"] = [self._fixed_t] * n
        size = len(self._fixed)
        gather = ((np.arange(n) * S)[:, None] + self._fixed[None, :]).reshape(-1) if self.cp_size > 1 else None
        for name in ("input_ids", "labels", "position_ids", "source_ids"):
            if name in want:
                arr = full[name][:N]
                if gather is not None:  # CP: this rank's slots of every item, in one gather per array
                    out = self._take("cp_" + name, n * size, arr.dtype.type)
                    arr = np.take(full[name], gather, out=out, mode="clip")
                cols[name] = _pieces(arr, [size] * n)

    def _zigzag(
        self,
        cols: dict[str, list[Any]],
        tokens: np.ndarray,
        seg: np.ndarray,
        first: np.ndarray,
        cu: np.ndarray,
        used: np.ndarray,
        sources: np.ndarray | None = None,
    ) -> None:
        """``cols``' token-slot fields under the per-document zigzag: the rank's slots of all items as runs
        (:func:`~loaders.context_parallel.zigzag_runs`), each per-slot array written once by
        :func:`~loaders.context_parallel.expand_runs` or one gather from ``tokens`` (or ``sources``, each
        position's source, for ``source_ids``); labels are gathered
        from the next position and fixed where a segment ends (its last chunk's last slot), in trailing
        padding and on CP padding slots, so no whole-sequence labels or positions are made."""
        S, n, want, cp = self.S, len(used), self.fields, self.cp_size
        N = n * S
        n_seg = first[1:] - first[:-1]
        rotation = np.arange(len(seg)) - np.repeat(first[:-1], n_seg)  # segment index inside its item
        runs = zigzag_runs(seg, rotation, cp, self.cp_rank)
        total = int(runs.length.sum())
        sizes = np.add.reduceat(runs.length, 2 * first[:-1]).tolist()
        pad = runs.padding()
        gather = expand_runs(runs.start, runs.length, runs.head, self._take("cp_gather", total))
        gather[pad] = N  # the pad_id slot
        if "input_ids" in want:
            x = np.take(tokens, gather, out=self._take("cp_input_ids", total), mode="clip")
            cols["input_ids"] = _pieces(x, sizes)
        if "labels" in want:
            y = np.take(tokens[1:], gather, out=self._take("cp_labels", total), mode="clip")
            last = runs.chunk == 2 * cp - 1  # the run ending at its segment's last token
            y[runs.head[last] + runs.length[last] - 1] = IGNORE_INDEX
            for k in np.flatnonzero(used < S).tolist():  # the item's trailing padding: its last segment's runs
                r = 2 * int(first[k + 1] - 1)
                y[runs.head[r] : runs.head[r + 1] + runs.length[r + 1]] = IGNORE_INDEX
            y[pad] = IGNORE_INDEX
            cols["labels"] = _pieces(y, sizes)
        if "position_ids" in want:
            # run i starts at output slot head[i] with its segment's position start[i] - (its segment's start)
            pos = self._take("cp_position_ids", total)
            self._positions(pos, runs.head - (runs.start - np.repeat(cu[:-1], 2)), runs.length)
            pos[pad] = 0
            cols["position_ids"] = _pieces(pos, sizes)
        if "indices" in want:
            local = self._take("cp_indices", total)
            parts = _pieces(local, sizes)
            for k, part in enumerate(_pieces(gather, sizes)):  # n slices: cheaper than a repeat
                torch.sub(part, k * S, out=parts[k])
            local[pad] = -1
            cols["indices"] = parts
        if sources is not None:  # a CP padding slot gathers position N, whose source is -1
            ids = np.take(sources, gather, out=self._take("cp_source_ids", total, np.int32), mode="clip")
            cols["source_ids"] = _pieces(ids, sizes)

    def _positions(self, out: np.ndarray, base: np.ndarray, lengths: np.ndarray) -> None:
        """Writes ``j - base[i]`` into ``out[j]`` (int64) for the ``lengths[i]`` slots of each run ``i``, back to
        back: a position inside its segment when ``base`` is each run's first slot less its first position.
        Worked in an unsigned type of 2 bytes (4 when S > 2^16) whose wrapping is exact as every position is <
        S: a quarter of the bytes of int64 for the repeat and the subtraction, then one widening copy (a fill
        and a running count over int64 cost twice as much)."""
        rel = base.astype(self._narrow).repeat(lengths)
        np.subtract(self._ramp(len(out)), rel, out=rel)
        np.copyto(out, rel)

    def _ramp(self, size: int) -> np.ndarray:
        """``0 … size − 1`` in the narrow position type (wrapping), made once for the largest chunk: read-only."""
        if len(self._ramp_of) < size:
            self._ramp_of = np.arange(size, dtype=np.int64).astype(self._narrow)
        return self._ramp_of[:size]

    def _take(self, role: str, size: int, dtype: type = np.int64) -> np.ndarray:
        """An array of ``size`` (int64, or ``dtype``: one per role) for ``role`` (one per array a chunk
        makes), reused when free.

        Fresh multi-megabyte arrays cost a page fault per 4 KiB on every chunk (the allocator maps them
        anew each time), more than the work itself; so a few arrays per role are kept and one is handed out
        again once no tensor of its earlier items is alive (CPython's reference count says so exactly: the
        storage each item's tensors share holds the array, through the numpy view it was made from).
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
        fresh: np.ndarray = np.empty(size + size // 4, dtype=dtype)  # room for a chunk with more CP padding
        if spare >= 0:
            pool[spare] = fresh
        elif len(pool) < 4:  # bounded: a consumer that keeps every item gets fresh arrays
            pool.append(fresh)
        return fresh[:size]


def _ranges(start: np.ndarray, count: np.ndarray) -> np.ndarray:
    """``start[k] … start[k] + count[k] − 1`` for every k, back to back (int64 [Σ count]): one shift per range
    over a count, one repeat and an in-place add (fewer numpy calls than expand_runs' fill, scatter and cumsum;
    a few µs per chunk matter here)."""
    head = np.add.accumulate(count)
    head -= count
    flat = (start - head).repeat(count)
    flat += np.arange(len(flat))
    return flat


def _whole_segments(table: SegmentTable) -> np.ndarray:
    """``table``'s segments [M, 4], or one row of -1 for a table with no segment at all (every entry is padding,
    and a padding entry reads row 0)."""
    return table.segments if len(table.segments) else np.full((1, 4), -1, np.int64)


def _pieces(arr: np.ndarray, sizes: list[int]) -> list[torch.Tensor]:
    """``arr`` as consecutive tensors of ``sizes`` rows (Σ = ``len(arr)``), all on ``arr``'s memory.

    ``unsafe_split_with_sizes``: the split without autograd's view records, which cost about a third of a
    chunk's tensor making (the pieces share ``arr``'s storage all the same); "unsafe" only for in-place
    changes under autograd, which integer tensors never take part in (every field is int32 or int64)."""
    return list(torch.from_numpy(arr).unsafe_split_with_sizes(sizes))
