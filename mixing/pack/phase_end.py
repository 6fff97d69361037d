"""What a phase end drops, and how old a carried unit may grow: the packer's rules against a length bias.

Best-fit decreasing takes each source's longest fitting units first, so without these rules a source's
shortest units would be carried step after step, replaced by newer longer ones, and left at the phase end.
Two rules keep what the trainer never sees from being chosen by length:

- **Ageing.** A unit still carried :data:`AGE_STEPS` steps after the step it was planned for is *urgent* at
  the next one: each choice of the fill takes an urgent unit before any other, within the same limits (among
  the units that bring their source closer to its due, and then among those that fit whatever the dues;
  :mod:`mixing.pack.pool`). An urgent unit therefore waits only while its source is at its due or it does not
  fit, and never behind a newer unit of its source that is as long: on the real mixes of
  ``benchmarks/packing.py`` every unit is placed within AGE_STEPS + 1 steps of its own, and only units of a
  phase's last steps reach its end. (Placing them
  whatever the dues would bound the wait exactly, but a plan that draws a source in lumps, a long document's
  pieces at one step and none at the next, would then miss the mixture goal of every 10-step window.)
- **The phase end.** When the pool first holds every unit the phase has left (the phase's next-to-last step,
  or its only one), what cannot fit in the remaining steps is set aside at once, per source, by a seeded
  hash of (source, doc_id, start, ord), the latest planned first, not by length (:func:`set_aside`): each
  source gives up a share of the excess in proportion to what it holds beyond its due tokens for those steps,
  so the mixture stays on the plan. The units set aside are dropped at the phase end, with whatever the last
  fill could not place.

The unit that completes a source's share may pass it: that many tokens of padding in the phase's last steps
(tens of thousands of tokens per run on the real mixes of ``benchmarks/packing.py``, which prints them), at
most :data:`OVERSHOOT` of the phase's tokens per source, beyond which the source stops short and the last
fill leaves the rest. Pure functions of their arguments: the same plan gives the same drops, whatever the
engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mixing.pack.pool import Pool

__all__ = ["AGE_STEPS", "OVERSHOOT", "drop_targets", "priority", "set_aside", "take_drops"]

AGE_STEPS = 1  # steps a unit may be carried before it is placed first (its step, then one more)
OVERSHOOT = 0.0005  # of a phase's tokens: what a source may lose beyond its share (the phase goal is 0.002)

_SALT = 0x5EED_D0C5_0F_A11  # any constant: the priorities are a fixed function of the plan's units
_U64 = np.uint64


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 arrays (wrapping arithmetic)."""
    x = (x + _U64(0x9E3779B97F4A7C15)) & _U64(0xFFFFFFFFFFFFFFFF)
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))  # type: ignore[no-any-return]


def priority(units: np.ndarray) -> np.ndarray:
    """uint64 [n]: each unit's drop priority, a hash of its (source, doc_id, start, ord), lowest dropped first.

    ``units`` int64 [n, 6] = (length, source, doc_id, start, step, ord). Independent of the length and of
    the step, so a phase end's choice is not one by length; the plan's seed moves it through doc_id and ord.
    """
    units = np.asarray(units, np.int64).reshape(-1, 6)
    h = np.full(len(units), _SALT, np.uint64)
    with np.errstate(over="ignore"):
        for c in (1, 2, 3, 5):
            h = _mix64(h ^ units[:, c].astype(np.uint64))
    return h


def drop_targets(held: np.ndarray, due: np.ndarray, capacity: float) -> np.ndarray:
    """float64 [k]: tokens each source sets aside so that the rest, Σ ``held`` − excess, fits ``capacity``.

    ``held``: tokens per source in the pool; ``due``: each source's due tokens over the remaining steps
    (Σ ``due`` = ``capacity``). The excess Σ held − capacity (none if ≤ 0) is shared among the sources that
    hold more than their due, in proportion to that surplus, so each source ends nearest its share.
    """
    held = np.asarray(held, np.float64)
    excess = float(held.sum()) - capacity
    over = np.maximum(held - np.asarray(due, np.float64), 0.0)
    if excess <= 0 or over.sum() <= 0:
        return np.zeros(len(held))
    return over * (excess / over.sum())  # type: ignore[no-any-return]


def set_aside(units: np.ndarray, targets: np.ndarray, overshoot: float = np.inf) -> np.ndarray:
    """bool [n]: the units a phase end drops, per source in a length-independent order until their tokens
    reach that source's ``targets``.

    The order: the latest planned step first (the units no fill has chosen from yet), then the lowest
    :func:`priority`. The unit that reaches a source's target is set aside too (the rest then fits) unless
    it would pass the target by more than ``overshoot`` tokens: then the source stops short of its target
    and the last fill leaves the difference (a source of long units in a short phase, where dropping a whole
    unit more would cost the phase's mixture more than it may).

    ``units`` int64 [n, 6] = (length, source, doc_id, start, step, ord), in any order (ties of priority,
    which a 64-bit hash makes rare, go to the earlier row). ``targets`` float64 [k] tokens per source.
    """
    units = np.asarray(units, np.int64).reshape(-1, 6)
    out = np.zeros(len(units), np.bool_)
    if not len(units):
        return out
    order = np.lexsort((priority(units), -units[:, 4], units[:, 1]))  # source, latest step, priority; stable
    src = units[order, 1]
    lengths = units[order, 0]
    first = np.concatenate([[True], src[1:] != src[:-1]])
    cum = np.cumsum(lengths)
    start = np.maximum.accumulate(np.where(first, cum - lengths, 0))  # tokens of the source's earlier units
    before = cum - lengths - start  # tokens the source set aside before this unit
    t = np.asarray(targets, np.float64)[src]
    out[order] = (before < t) & (before + lengths <= t + overshoot)
    return out


def take_drops(pool: Pool, due: np.ndarray, capacity: float, overshoot: float) -> np.ndarray:
    """Take out of ``pool``, which holds all that its phase has left, the units the phase end drops, given the
    sources' ``due`` tokens (float64 [k]) over the ``capacity`` tokens of the phase's remaining steps;
    return them as int64 [n, 6] rows. ``overshoot``: as :func:`set_aside`'s."""
    held = pool.held()
    tokens = np.bincount(held[:, 1], weights=held[:, 0], minlength=len(due))
    mask = set_aside(held, drop_targets(tokens, due, capacity), overshoot)
    if mask.any():
        pool.remove(mask)
    return held[mask]
