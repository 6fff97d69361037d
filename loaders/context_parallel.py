"""CP balance: which token slots of a packed sequence each context-parallel rank holds.

With causal attention restricted to each document (``cu_seqlens``), a query at position ``p`` of its
document attends to ``p + 1`` keys, so a contiguous split of the sequence gives the last CP rank far more
work than the first. :func:`document_zigzag` splits *every document* into ``2·cp`` equal chunks and gives
rank ``r`` chunks ``r`` and ``2·cp − 1 − r`` (head–tail order), which makes every rank's work equal.
A document whose length is not a multiple of ``2·cp`` is padded with fewer than ``2·cp`` slots, placed
*before* the document: those slots are queries without keys, so the balance stays exact up to a few pairs
(padding at the end would take the heaviest queries from rank 0 and cost several percent on short
documents), and the chunk pair a rank takes rotates from one document to the next, so that what rounding
leaves uneven on a short document lands on a different rank each time.

Every split returns, per rank, ``indices`` int64 [n]: the position in the sequence of each of the rank's
slots, ``-1`` for a padding slot. All ranks get the same ``n`` for one sequence. The baselines
(:func:`contiguous`, :func:`sequence_zigzag`) are kept for comparison (docs/design.md's B0 and B1).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "SPLITS",
    "ZigzagRuns",
    "attention_work",
    "contiguous",
    "document_zigzag",
    "expand_runs",
    "sequence_zigzag",
    "split",
    "zigzag_runs",
]


def document_zigzag(seg_lens: np.ndarray, cp_size: int, cp_rank: int) -> np.ndarray:
    """Slots of ``cp_rank`` for a sequence whose segments (documents, trailing padding) have ``seg_lens``.

    Segment of ``l`` tokens → padded to ``L = 2·cp·ceil(l / 2cp)`` (front padding ``L − l < 2·cp``), cut into
    ``2·cp`` chunks of ``m = L / 2cp``; of segment ``d``, this rank holds chunks ``j`` and ``2cp − 1 − j``
    with ``j = (cp_rank + d) mod cp``, in that order. Returns int64 [Σ 2m] (identical length on every
    rank), ``-1`` for padding.
    """
    seg_lens = np.asarray(seg_lens, dtype=np.int64)
    if cp_size == 1 or len(seg_lens) == 0:
        return np.arange(int(seg_lens.sum()), dtype=np.int64)
    two = 2 * cp_size
    m = -(-seg_lens // two)
    pad = two * m - seg_lens
    starts = np.cumsum(seg_lens) - seg_lens
    j = (cp_rank + np.arange(len(seg_lens))) % cp_size  # rotate pairs: rounding leftovers average out
    base = starts - pad  # where the padded segment would start
    run_start = np.stack([base + j * m, base + (two - 1 - j) * m], axis=1).reshape(-1)  # two runs per segment
    run_len = np.repeat(m, 2)
    ends = np.cumsum(run_len)
    out = np.arange(int(ends[-1]), dtype=np.int64) + np.repeat(run_start - (ends - run_len), run_len)
    if pad.any():
        out[out < np.repeat(starts, 2 * m)] = -1  # slots before their segment's start are front padding
    return out


class ZigzagRuns(NamedTuple):
    """One CP rank's slots of many segments as runs of consecutive positions (two runs per segment, in
    order); all int64 [2·segments]. ``start``: position of the run's first slot (below its segment's start
    for front padding); ``length``: ``m`` of its segment (≥ 1); ``chunk``: which of the ``2·cp`` chunks it
    is; ``front``: its leading padding slots; ``head``: where the run begins among the rank's slots."""

    start: np.ndarray
    length: np.ndarray
    chunk: np.ndarray
    front: np.ndarray
    head: np.ndarray

    def padding(self) -> np.ndarray:
        """Slot numbers (int64, ascending) of the padding slots (at most ``2·cp − 1`` per segment)."""
        first = np.cumsum(self.front) - self.front
        return np.repeat(self.head - first, self.front) + np.arange(int(self.front.sum()))


def zigzag_runs(seg_lens: np.ndarray, rotation: np.ndarray, cp_size: int, cp_rank: int) -> ZigzagRuns:
    """:func:`document_zigzag` of many sequences at once, as runs (for a chunk of items: no per-slot work).

    ``seg_lens`` int64 [k] (≥ 1 each): the segments of all sequences back to back (positions continue
    from one sequence to the next, e.g. item ``i`` starting at ``i·S``); ``rotation`` int64 [k]: each
    segment's index inside its own sequence (``d`` of :func:`document_zigzag`). Expanded by
    :func:`expand_runs`, with the padding slots set to -1, one sequence gives :func:`document_zigzag`'s slots.
    """
    two = 2 * cp_size
    m = -(-seg_lens // two)
    pad = two * m - seg_lens
    base = np.cumsum(seg_lens) - seg_lens - pad  # where each padded segment would start
    j = (cp_rank + rotation) % cp_size  # rotate pairs: rounding leftovers average out
    chunk = np.stack([j, two - 1 - j], axis=1).reshape(-1)
    length = np.repeat(m, 2)
    head = np.cumsum(length) - length
    front = np.clip(np.repeat(pad, 2) - chunk * length, 0, length)
    return ZigzagRuns(np.repeat(base, 2) + chunk * length, length, chunk, front, head)


def expand_runs(start: np.ndarray, length: np.ndarray, head: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Writes the runs ``start[i], start[i] + 1, …`` (``length[i] ≥ 1`` values each, run ``i`` beginning at
    ``out[head[i]]``) back to back into ``out`` (int64 [Σ length]) in place and returns it: a fill, a small
    scatter and a cumsum, no temporary the size of ``out``."""
    out.fill(1)
    if len(start):
        out[head[0]] = start[0]
        out[head[1:]] = start[1:] - (start[:-1] + length[:-1] - 1)  # the step from each run's last value
        np.cumsum(out, out=out)
    return out


def contiguous(seg_lens: np.ndarray, cp_size: int, cp_rank: int) -> np.ndarray:
    """B0: the ``cp_rank``-th contiguous ``S / cp`` slice (``S`` must be divisible by ``cp``)."""
    s = int(np.asarray(seg_lens).sum())
    n = s // cp_size
    return np.arange(cp_rank * n, (cp_rank + 1) * n, dtype=np.int64)


def sequence_zigzag(seg_lens: np.ndarray, cp_size: int, cp_rank: int) -> np.ndarray:
    """B1 (Megatron's default): the whole sequence in ``2·cp`` chunks, this rank's ``r`` and ``2cp − 1 − r``."""
    s = int(np.asarray(seg_lens).sum())
    m = s // (2 * cp_size)
    a, b = cp_rank, 2 * cp_size - 1 - cp_rank
    return np.concatenate([np.arange(a * m, (a + 1) * m), np.arange(b * m, (b + 1) * m)]).astype(np.int64)


SPLITS = {"zigzag": document_zigzag, "contiguous": contiguous, "sequence_zigzag": sequence_zigzag}


def split(seg_lens: np.ndarray, cp_size: int, cp_rank: int, how: str = "zigzag") -> np.ndarray:
    """The slots of ``cp_rank`` under the split named ``how`` (a key of :data:`SPLITS`)."""
    if how not in SPLITS:
        raise ValueError(f"unknown CP split {how!r}; expected one of {sorted(SPLITS)}")
    return SPLITS[how](seg_lens, cp_size, cp_rank)


def attention_work(seg_lens: np.ndarray, indices: np.ndarray) -> int:
    """Unmasked query·key pairs of the queries at ``indices`` under per-segment causal masking (``-1`` = 0)."""
    seg_lens = np.asarray(seg_lens, dtype=np.int64)
    cu = np.concatenate([[0], np.cumsum(seg_lens)])
    real = indices[indices >= 0]
    pos = real - cu[np.searchsorted(cu, real, side="right") - 1]
    return int((pos + 1).sum())
