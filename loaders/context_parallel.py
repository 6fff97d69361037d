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

:func:`thd` is the partition Transformer Engine's THD format uses (``thd_get_partitioned_indices``, which
Megatron-core's ``get_batch_on_this_cp_rank`` calls for packed sequences): each segment padded at its *end* to
a multiple of ``2·cp``, rank ``r`` taking chunks ``r`` and ``2·cp − 1 − r`` of every segment, no rotation.
:func:`thd_slots` adds what a THD attention call takes beside the slots: ``cu_seqlens`` (real lengths) and
``cu_seqlens_padded``, both over the whole sequence (Transformer Engine divides them by ``cp_size`` itself).
:class:`loaders.PackedDataset` cuts each document only for ``"zigzag"``; its items under the other splits take
slots that depend on ``S`` alone (``"thd"`` there cuts each sequence as one segment), and
:class:`loaders.steps.StepLoader` cuts every document of a micro-batch for ``"thd"``.

Every split returns, per rank, ``indices`` int64 [n]: the position in the sequence of each of the rank's
slots, ``-1`` for a padding slot. All ranks get the same ``n`` for one sequence. The baselines
(:func:`contiguous`, :func:`sequence_zigzag`) are kept for comparison (docs/design.md's B0 and B1).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = [
    "SPLITS",
    "ThdSlots",
    "ZigzagRuns",
    "attention_work",
    "contiguous",
    "cu_seqlens_padded",
    "document_zigzag",
    "expand_runs",
    "sequence_zigzag",
    "split",
    "thd",
    "thd_slots",
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


def cu_seqlens_padded(seg_lens: np.ndarray, cp_size: int) -> np.ndarray:
    """Boundaries of the segments ``seg_lens`` (int [k]) each rounded up to a multiple of ``2·cp_size``, as
    :func:`document_zigzag` and :func:`thd` pad them: int32 [k+1] from 0 (``cp_size == 1``: no padding, the
    plain ``cu_seqlens``). Every rank holds ``[-1] / cp_size`` slots."""
    seg_lens = np.asarray(seg_lens, dtype=np.int64)
    two = 2 * cp_size if cp_size > 1 else 1
    out = np.zeros(len(seg_lens) + 1, dtype=np.int64)
    np.cumsum(-(-seg_lens // two) * two, out=out[1:])
    return out.astype(np.int32)


class ThdSlots(NamedTuple):
    """One CP rank's slots of a sequence under Transformer Engine's THD partition (:func:`thd_slots`).

    Per slot, int64 [n] (``n = cu_seqlens_padded[-1] / cp``, the same on every rank): ``padded``, its position
    in the padded sequence (what ``thd_get_partitioned_indices`` returns for ``cu_seqlens_padded``);
    ``indices``, its position in the unpadded sequence, ``-1`` for padding; ``position_ids``, its offset in
    its padded segment (Transformer Engine's ``generate_positional_ids_for_cp``: 0 at the segment's start,
    counting on through the padding at its end). Per segment, int32 [k+1], the whole sequence's (the same on
    every rank, as Transformer Engine and Megatron-core take them): ``cu_seqlens`` (real lengths) and
    ``cu_seqlens_padded`` (each length rounded up to a multiple of ``2·cp``)."""

    padded: np.ndarray
    indices: np.ndarray
    position_ids: np.ndarray
    cu_seqlens: np.ndarray
    cu_seqlens_padded: np.ndarray


def thd_slots(seg_lens: np.ndarray, cp_size: int, cp_rank: int) -> ThdSlots:
    """Transformer Engine's THD partition of a sequence whose segments have ``seg_lens`` (int [k], ≥ 0 each).

    Segment of ``l`` tokens → padded at its end to ``L = 2·cp·ceil(l / 2cp)`` (``L − l < 2·cp`` padding slots,
    after its last token: causal attention keeps every real query off them), cut into ``2·cp`` chunks of
    ``m = L / 2cp``; this rank holds chunks ``cp_rank`` and ``2cp − 1 − cp_rank`` of every segment, in order,
    with no rotation (Transformer Engine's kernels assume this layout). ``cp_size == 1`` pads nothing and
    keeps every slot, as Megatron-core does without context parallelism.
    """
    seg_lens = np.asarray(seg_lens, dtype=np.int64)
    k = len(seg_lens)
    cu = np.zeros(k + 1, dtype=np.int64)
    np.cumsum(seg_lens, out=cu[1:])
    pcu = cu_seqlens_padded(seg_lens, cp_size).astype(np.int64)
    if cp_size == 1:  # one run per segment: all of it
        run_seg, run_off, run_len = np.arange(k), np.zeros(k, dtype=np.int64), seg_lens
    else:  # two runs of m slots per segment, at offsets r·m and (2cp − 1 − r)·m of the padded segment
        two = 2 * cp_size
        m = (pcu[1:] - pcu[:-1]) // two
        run_seg = np.repeat(np.arange(k), 2)
        run_off = (np.stack([np.full(k, cp_rank), np.full(k, two - 1 - cp_rank)], axis=1) * m[:, None]).reshape(-1)
        run_len = np.repeat(m, 2)
    head = np.cumsum(run_len) - run_len  # where each run begins among the rank's slots
    seg = np.repeat(run_seg, run_len)
    offset = np.arange(int(run_len.sum()), dtype=np.int64) - np.repeat(head - run_off, run_len)
    indices = np.where(offset < seg_lens[seg], cu[:-1][seg] + offset, -1)
    return ThdSlots(pcu[:-1][seg] + offset, indices, offset, cu.astype(np.int32), pcu.astype(np.int32))


def thd(seg_lens: np.ndarray, cp_size: int, cp_rank: int) -> np.ndarray:
    """The slots of ``cp_rank`` under Transformer Engine's THD partition (:func:`thd_slots`'s ``indices``):
    int64 [Σ L / cp], ``-1`` for the padding at the end of each segment."""
    return thd_slots(seg_lens, cp_size, cp_rank).indices


SPLITS = {"zigzag": document_zigzag, "contiguous": contiguous, "sequence_zigzag": sequence_zigzag, "thd": thd}


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
