"""Byte ranges of one remote object coalesced into few requests, and the requests' bytes cut back into ranges.

A shard gathers thousands of short documents from a chunk: one request each would cost a round trip each. So
ranges less than :data:`GAP` apart are fetched as one request, but no request spans more than :data:`BLOCK`
bytes (unless one range alone does). Empty ranges (``end <= start``) are never asked for: an empty HTTP range
would fetch the whole object. Offsets are byte offsets, ``[start, end)``; the plan depends only on the ranges
(deterministic), and :meth:`Requests.cut` returns exactly the bytes a read of each range would.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BLOCK", "GAP", "Requests", "coalesce"]

GAP = 1 << 20  # ranges of one object less than this apart are fetched as one request
BLOCK = 64 << 20  # but no request larger than this


@dataclass(frozen=True)
class Requests:
    """The requests that fetch ``ranges``: ``blocks[k]`` is ``[start, end)`` of request k, in offset order;
    ``wanted`` the indices of the non-empty ranges, sorted by ``(start, end)`` (the order the blocks were made)."""

    ranges: list[tuple[int, int]]
    wanted: list[int]
    blocks: list[list[int]]

    def cut(self, got: Sequence[bytes]) -> list[bytes]:
        """Each range's bytes (``b""`` for an empty one), given ``got[k]``: the bytes of ``blocks[k]``."""
        out = [b""] * len(self.ranges)
        blocks, k = self.blocks, 0
        for i in self.wanted:  # in the same order the blocks were made
            s, e = self.ranges[i]
            while s >= blocks[k][1] or e > blocks[k][1]:
                k += 1
            out[i] = got[k][s - blocks[k][0] : e - blocks[k][0]]
        return out


def coalesce(ranges: Sequence[tuple[int, int]]) -> Requests:
    """The requests that fetch ``ranges`` (``(start, end)`` each), those less than :data:`GAP` apart merged into
    one while it stays within :data:`BLOCK` bytes."""
    ranges = list(ranges)
    wanted = sorted((i for i, (s, e) in enumerate(ranges) if e > s), key=lambda i: ranges[i])
    blocks: list[list[int]] = []  # [start, end] of each request, ranges merged where close
    for i in wanted:  # (an empty HTTP range would fetch the whole object: never asked for)
        s, e = ranges[i]
        if blocks and s <= blocks[-1][1] + GAP and e - blocks[-1][0] <= BLOCK:
            blocks[-1][1] = max(blocks[-1][1], e)
        else:
            blocks.append([s, e])
    return Requests(ranges, wanted, blocks)
