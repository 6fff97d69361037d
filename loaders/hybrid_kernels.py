"""The hybrid deal's inner loops as scalar kernels (:mod:`loaders.hybrid_placement`): LPT of whole documents,
a split document onto its aligned block, and the water-fill's passes. numba compiles them when asked (engine
``"compiled"``, opt-in: :func:`default_engine`); by default the placement runs its numpy code (engine ``"numpy"``),
which deals the same documents to the same ranks and micro-batches, bit for bit (the tests hold the engines to it).
A third engine, ``"interpreted"``, runs these kernels in the Python interpreter (slow): the tests check the
kernels with it where numba is not installed.

Every kernel takes the placement's state as arrays and updates it in place: ``load`` float64 [W] (predicted
time per rank), ``room`` int64 [W, M] (free room per rank and micro-batch, in units of ``1 / top`` token),
``first`` / ``mb`` int64 [n] (each document's first rank and micro-batch), ``time`` float64 [n] (per-rank
time), ``share`` int64 [n] (tokens on each rank of its block, in the same units); a kernel that opens
micro-batches returns the new ``room``. Same results as numpy, operation for operation: loads are summed
as ``np.bincount`` sums them (per rank from 0.0, in document order, then added), ties go to the lower rank and
micro-batch as ``np.argmin`` breaks them, and the one pairwise float sum (a water-fill class's time) is
numpy's, taken before the kernel. Integer sums go through float64 where numpy's do: exact while a step's
tokens times the largest block stay below 2**53.

The compiled kernels are cached by numba (``__pycache__``, or its user-wide cache where that is read-only):
the first call in a process loads them (about a second), or compiles them once (some seconds).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

__all__ = ["ENGINES", "Kernels", "default_engine", "kernels"]

ENGINES = ("compiled", "numpy")
_ENV = "WEIR_HYBRID_ENGINE"  # "compiled": opt in to numba's kernels where numba is installed


def default_engine() -> str:
    """``"numpy"`` (within 5 ms a step at 1 M tokens over 64 ranks: docs/benchmarks.md), or the environment's
    ``WEIR_HYBRID_ENGINE`` (one of :data:`ENGINES`). ``"compiled"`` is opt-in: the loaders ask a training node
    for no numba, and importing it costs a process about a second."""
    forced = os.environ.get(_ENV)
    if forced:
        if forced not in ENGINES:
            raise ValueError(f"{_ENV}={forced!r}: expected one of {ENGINES} (compiled needs numba)")
        return forced
    return "numpy"


# ---- kernels: plain Python that numba compiles ---------------------------------------------------------------


def _widened(room: np.ndarray, k: int, cap: int) -> np.ndarray:
    """``room`` with ``k`` new micro-batches of ``cap`` free room on every rank."""
    out = np.full((room.shape[0], room.shape[1] + k), cap, np.int64)
    out[:, : room.shape[1]] = room
    return out


def _lpt_kernel(
    load: np.ndarray,
    room: np.ndarray,
    first: np.ndarray,
    mb: np.ndarray,
    time: np.ndarray,
    share: np.ndarray,
    docs: np.ndarray,
    cap: int,
    per_mb: float,
) -> np.ndarray:
    """Whole documents ``docs`` (longest first), each onto the least-loaded rank (ties: the lower) with room
    in some micro-batch, the first such; where that rank has none, the least loaded of those with room unless
    it is busier by more than ``per_mb`` (or none has room): then a new micro-batch on every rank."""
    ranks = load.shape[0]
    loads = load.copy()  # the running loads the choices see; ``load`` gets np.bincount's sums at the end
    most = np.empty(ranks, np.int64)
    for r in range(ranks):
        most[r] = room[r].max()
    for i in range(docs.shape[0]):
        j = docs[i]
        t, s = time[j], share[j]
        r = 0
        for q in range(1, ranks):
            if loads[q] < loads[r]:
                r = q
        ld = loads[r]
        if most[r] < s:
            alt = -1
            for q in range(ranks):
                if most[q] >= s and (alt < 0 or loads[q] < loads[alt]):
                    alt = q
            if alt >= 0 and loads[alt] - ld <= per_mb:
                r, ld = alt, loads[alt]
            else:
                room = _widened(room, 1, cap)
                most[:] = cap
        m = 0
        while room[r, m] < s:
            m += 1
        room[r, m] -= s
        most[r] = room[r].max()
        first[j], mb[j] = r, m
        loads[r] = ld + t
    acc = np.zeros(ranks)
    for i in range(docs.shape[0]):
        acc[first[docs[i]]] += time[docs[i]]
    for r in range(ranks):
        load[r] += acc[r]
    return room


def _block_kernel(
    load: np.ndarray,
    room: np.ndarray,
    first: np.ndarray,
    mb: np.ndarray,
    time: np.ndarray,
    share: np.ndarray,
    j: int,
    d: int,
    cap: int,
    per_mb: float,
    allow_open: bool,
) -> tuple[np.ndarray, bool]:
    """Split document ``j`` (degree ``d``) onto the aligned block whose busiest rank is least loaded among
    those with a micro-batch that has room on all their ranks (its fullest such micro-batch; ties: the lower
    block and micro-batch), unless a new micro-batch on the least-loaded block costs less (``allow_open``).
    Returns the room and whether it was placed."""
    blocks, s, width = load.shape[0] // d, share[j], room.shape[1]
    best, light = -1, 0
    best_busy = light_busy = np.inf
    for b in range(blocks):
        busy = load[b * d : (b + 1) * d].max()
        if busy < light_busy:
            light, light_busy = b, busy
        if busy < best_busy:
            for m in range(width):
                if room[b * d : (b + 1) * d, m].min() >= s:
                    best, best_busy = b, busy
                    break
    if best >= 0 and (best_busy - light_busy <= per_mb or not allow_open):
        b, m, fullest = best, -1, 0
        for k in range(width):
            free = room[b * d : (b + 1) * d, k].min()
            if free >= s and (m < 0 or free < fullest):
                m, fullest = k, free
    elif allow_open:
        b, m = light, width
        room = _widened(room, 1, cap)
    else:
        return room, False
    load[b * d : (b + 1) * d] += time[j]
    room[b * d : (b + 1) * d, m] -= s
    first[j], mb[j] = b * d, m
    return room, True


def _water_level(load: np.ndarray, total: float) -> float:
    """The level ``h`` with ``Σ max(h − load, 0) = total``."""
    low = np.sort(load)
    levels = (total + np.cumsum(low)) / np.arange(1, low.shape[0] + 1)
    for i in range(low.shape[0] - 1):
        if levels[i] <= low[i + 1]:
            return float(levels[i])
    return float(levels[-1])


def _runs_kernel(
    load: np.ndarray,
    room: np.ndarray,
    first: np.ndarray,
    mb: np.ndarray,
    time: np.ndarray,
    share: np.ndarray,
    docs: np.ndarray,
    rank: np.ndarray,
) -> np.ndarray:
    """Lay ``docs`` into the ranks ``rank`` (nondecreasing), each rank's run into its free room micro-batch
    after micro-batch (next fit: a document that would cross a micro-batch's end starts the next one).
    Returns the documents that did not fit, in order."""
    ranks, width = room.shape[0], room.shape[1]
    bounds = np.cumsum(room, axis=1)  # where each micro-batch's free room ends, per rank
    acc = np.zeros(ranks)
    left = np.empty(docs.shape[0], np.int64)
    n_left, at, prev = 0, 0, -1
    for i in range(docs.shape[0]):
        j, r = docs[i], rank[i]
        s = share[j]
        if r != prev:
            at, prev = 0, r
        for k in range(width - 1):
            if at < bounds[r, k] < at + s:
                at = bounds[r, k]
        m = 0
        while m < width and bounds[r, m] <= at:
            m += 1
        if m < width and at + s <= bounds[r, m]:
            first[j], mb[j] = r, m
            acc[r] += time[j]
            room[r, m] -= s
        else:
            left[n_left] = j
            n_left += 1
        at += s
    for r in range(ranks):
        load[r] += acc[r]
    return left[:n_left]


def _classes_kernel(
    load: np.ndarray,
    room: np.ndarray,
    first: np.ndarray,
    mb: np.ndarray,
    time: np.ndarray,
    share: np.ndarray,
    docs: np.ndarray,
    starts: np.ndarray,
    totals: np.ndarray,
    cap: int,
    per_mb: float,
    widen: bool,
) -> np.ndarray:
    """The water-fill, class after class: ``docs[starts[c]:starts[c + 1]]`` (longest first) of total time
    ``totals[c]`` each (numpy's sum). A pass lays the ranks' shortfalls below the level end to end, and so the
    documents; a rank takes those wholly within its shortfall; ``widen`` opens the micro-batches the runs
    need beyond the free room; what does not fit goes in runs cut at the ranks' free room (three times at
    most, opening what capacity lacks), then by LPT, and so do the documents that straddled two shortfalls,
    after the pass. Returns the room."""
    ranks = load.shape[0]
    for c in range(starts.shape[0] - 1):
        part = docs[starts[c] : starts[c + 1]]
        t = time[part]
        edges = np.cumsum(np.maximum(_water_level(load, totals[c]) - load, 0.0))
        end = np.cumsum(t)
        rank = np.searchsorted(edges, end - t, side="right")
        inside = np.zeros(part.shape[0], np.bool_)
        for i in range(part.shape[0]):
            inside[i] = rank[i] < ranks and end[i] <= edges[min(rank[i], ranks - 1)] * (1 + 1e-12)
        carried, placed, rank = part[~inside], part[inside], rank[inside]
        if widen and placed.shape[0]:
            s = share[placed]
            want = np.zeros(ranks)
            for i in range(placed.shape[0]):
                want[rank[i]] += s[i]
            short = int((want - room.sum(axis=1)).max())
            if short > 0:  # a run leaves about a document's room unused at each micro-batch's end
                mean = int(s.sum() / s.shape[0])
                room = _widened(room, -(-(short + mean * room.shape[1]) // cap), cap)
        pending = _runs_kernel(load, room, first, mb, time, share, placed, rank)
        for _ in range(3):
            if not pending.shape[0]:
                break
            s = share[pending]
            at = np.cumsum(s) - s / 2
            cut = np.minimum(np.searchsorted(np.cumsum(room.sum(axis=1)), at, side="right"), ranks - 1)
            pending = _runs_kernel(load, room, first, mb, time, share, pending, cut)
            need = share[pending].sum() - room.sum()
            if need <= 0:
                break
            room = _widened(room, -(-need // (ranks * cap)), cap)
        room = _lpt_inner(load, room, first, mb, time, share, pending, cap, per_mb)
        room = _lpt_inner(load, room, first, mb, time, share, carried, cap, per_mb)
    return room


_lpt_inner = _lpt_kernel  # the water-fill's own LPT: compiled with it (:func:`_compile`)
_lpt: Any = None  # the compiled kernels, once :func:`_compile` made them
_block: Any = None
_classes: Any = None


class Kernels:
    """The kernels one engine runs: compiled by numba, or the same functions in the interpreter."""

    def __init__(self, compiled: bool) -> None:
        self.lpt: Any = _lpt if compiled else _lpt_kernel
        self.block: Any = _block if compiled else _block_kernel
        self.classes: Any = _classes if compiled else _classes_kernel


_COMPILED: list[bool] = []  # [True] once numba compiled the kernels in this process


def _compile() -> None:
    """Compile the kernels with numba, once per process (their callees first: numba binds the globals a kernel
    calls when it compiles it). numba is imported here only: the loaders never need it (see
    :func:`default_engine`)."""
    global _widened, _water_level, _runs_kernel, _lpt, _lpt_inner, _block, _classes
    if _COMPILED:
        return
    try:
        from numba import njit
    except ImportError:
        raise ValueError(f"the compiled hybrid engine ({_ENV}=compiled) needs numba, which is not installed") from None
    _widened = njit(cache=True, nogil=True)(_widened)
    _water_level = njit(cache=True, nogil=True)(_water_level)
    _runs_kernel = njit(cache=True, nogil=True)(_runs_kernel)
    _lpt = _lpt_inner = njit(cache=True, nogil=True)(_lpt_kernel)
    _block = njit(cache=True, nogil=True)(_block_kernel)
    _classes = njit(cache=True, nogil=True)(_classes_kernel)
    _COMPILED.append(True)


def kernels(engine: str) -> Kernels | None:
    """The kernels of ``engine`` (``"compiled"``, or ``"interpreted"`` for tests); None for ``"numpy"``."""
    if engine == "numpy":
        return None
    if engine == "compiled":
        _compile()
        return Kernels(compiled=True)
    if engine == "interpreted":
        return Kernels(compiled=False)
    raise ValueError(f"unknown hybrid engine {engine!r}; one of {ENGINES} (or 'interpreted', for tests)")
