"""Where the item builder (:mod:`loaders.items`) gets a chunk's tokens and segments: one interface, two feeds.

- :class:`IndexFeed`, a local build: tokens copied row by row from the memory-mapped shards, segments from
  the whole build's table (the node's index, :mod:`loaders.index`, memory-mapped; else read once from the
  shards' metadata), which also holds every sequence's ``cu_seqlens`` for the lean fields.
- :class:`ViewFeed`, a build streamed from object storage (:mod:`loaders.remote`): each sequence's verified
  view (:meth:`~loaders.integrity.VerifiedShardSet.verified_sequence`), fetched through the bounded cache;
  no other shard's segments are loaded. Its chunks never span two shards, so a damaged shard stops the
  stream right before its first item, and building a chunk needs one shard in the cache.

Both give the builder the same :class:`SegmentTable`: the items are identical whichever feeds them.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from loaders.integrity import VerifiedShardSet

__all__ = ["Feed", "IndexFeed", "SegmentTable", "ViewFeed", "feed_for"]

_A = TypeVar("_A", bound=tuple[int, ...])


@dataclass(frozen=True)
class SegmentTable:
    """Sequences' segments as the builder reads them (row ``r``: one sequence). ``offsets`` int64 [R+1]: row
    ``r``'s segments are ``lengths[offsets[r]:offsets[r+1]]`` (int64, tokens of each document, in order);
    ``used`` int64 [R]: real tokens; ``steps`` int64 [R]: build step; ``cu``: every row's item
    ``cu_seqlens`` back to back (int32, trailing padding as one more segment) and where each begins (int64
    [R+1]), when a build index holds them, else None; ``segments``: the segments whole, int64 [M, 4] =
    (source index, doc_id, start, length), ``lengths`` their last column (what provenance fields read);
    ``item_segments``: the index's every row's item ``segments`` back to back (int64 [E, 3]; row ``r``'s are
    ``item_segments[cu[1][r] - r : cu[1][r+1] - r - 1]``), with ``cu``, else None."""

    offsets: np.ndarray
    lengths: np.ndarray
    used: np.ndarray
    steps: np.ndarray
    segments: np.ndarray
    cu: tuple[np.ndarray, np.ndarray] | None = None
    item_segments: np.ndarray | None = None


class Feed(ABC):
    """A chunk's tokens and segments from ``shards``: :meth:`read`, cut into chunks by :meth:`chunks`."""

    per_shard = False  # chunks end where the shard changes

    def __init__(self, shards: VerifiedShardSet) -> None:
        self.shards = shards
        self._first = np.array([sh.first_sequence for sh in shards.manifest.shards], dtype=np.int64)

    @abstractmethod
    def read(self, idx: np.ndarray, block: np.ndarray) -> tuple[SegmentTable, np.ndarray]:
        """Copy the tokens of global sequences ``idx`` (int64 [n]) into ``block`` (int64 [n, S]) and return
        a table holding them and their rows in it (int64 [n]); raises
        :class:`~loaders.integrity.CorruptShardError` before copying a token of a damaged shard."""

    def chunks(self, items: Iterable[_A], size: int) -> Iterator[list[_A]]:
        """``items`` (tuples whose last entry is a global sequence) in consecutive lists of at most ``size``."""
        if not self.per_shard:
            yield from _cut(iter(items), size)
            return
        for _, run in itertools.groupby(items, key=lambda a: int(np.searchsorted(self._first, a[-1], side="right"))):
            yield from _cut(run, size)


def _cut(items: Iterator[_A], size: int) -> Iterator[list[_A]]:
    while chunk := list(itertools.islice(items, size)):
        yield chunk


class IndexFeed(Feed):
    """A local build: the whole build's table, tokens from the memory-mapped shards (see the module)."""

    def __init__(self, shards: VerifiedShardSet) -> None:
        super().__init__(shards)
        self._plain: dict[int, np.ndarray] = {}
        self._table: SegmentTable | None = None

    def __getstate__(self) -> dict[str, Any]:
        # a spawned worker maps shards itself (no pickled copies of their arrays)
        return {**self.__dict__, "_plain": {}, "_table": None}

    def read(self, idx: np.ndarray, block: np.ndarray) -> tuple[SegmentTable, np.ndarray]:
        shard = self._first.searchsorted(idx, side="right") - 1
        rows = (idx - self._first[shard]).tolist()
        plain = self._plain
        # one copy per row (no gathered temporary), converting to int64 on the way
        for k, s in enumerate(shard.tolist()):
            block[k] = (plain[s] if s in plain else self._stored(s))[rows[k]]
        if self._table is None:  # the whole build's: the same for every chunk
            shards, index = self.shards, self.shards.index
            offsets, segments = shards.segments
            cu = (index["cu_seqlens"], index["cu_offsets"]) if index is not None else None
            items = index["item_segments"] if index is not None else None
            self._table = SegmentTable(offsets, segments[:, 3], shards.seq_tokens, shards.steps, segments, cu, items)
        return self._table, idx

    def _stored(self, k: int) -> np.ndarray:
        """Shard ``k``'s tokens as a plain ndarray over its memory map (row access without memmap's overhead)."""
        if k not in self._plain:
            self._plain[k] = np.asarray(self.shards.shard_tokens(k))
        return self._plain[k]


class ViewFeed(Feed):
    """A streamed build: each sequence's verified view, fetched through the cache (see the module)."""

    per_shard = True

    def read(self, idx: np.ndarray, block: np.ndarray) -> tuple[SegmentTable, np.ndarray]:
        segments, steps = [], []
        for k, i in enumerate(idx.tolist()):
            view = self.shards.verified_sequence(i)
            block[k] = view.tokens
            segments.append(np.asarray(view.segments, dtype=np.int64).reshape(-1, 4))
            steps.append(view.step)
        counts = np.array([len(x) for x in segments], dtype=np.int64)
        offsets = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        whole = np.concatenate(segments) if segments else np.zeros((0, 4), np.int64)
        flat = whole[:, 3]
        cum = np.concatenate([[0], np.cumsum(flat)])
        used = cum[offsets[1:]] - cum[offsets[:-1]]
        return SegmentTable(offsets, flat, used, np.array(steps, dtype=np.int64), whole), np.arange(len(idx))


def feed_for(shards: VerifiedShardSet) -> Feed:
    """The feed of ``shards``: :class:`ViewFeed` when streamed, else :class:`IndexFeed`."""
    return ViewFeed(shards) if shards.streamed else IndexFeed(shards)
