"""What a phase end drops: the plan's surplus, chosen by a seeded hash instead of by length.

Best-fit decreasing takes each source's longest fitting units first, so what is still carried when a phase
ends is its sources' shortest units: dropped as they are, a systematic bias against short documents. At the
step where the packer first holds every unit its phase has left (the phase's next-to-last step, or its only
one), :func:`drop_mask` swaps that choice for a length-blind one, at no cost in padding:

1. **Dry run.** The phase's remaining fills are run on a copy of the pool (a fresh pool given the same
   units: the fills are deterministic), exactly as the packer would run them. What they leave per source,
   ``X_s`` tokens, is what the phase end would drop anyway: the plan's draw beyond the phase's share of each
   source, and the padding.
2. **Set aside.** Per source, units planned at that step or later are set aside in a length-blind order, the
   latest planned step first (units no fill has chosen from yet, a sample of the source's lengths) and then by
   :func:`priority`, a seeded hash of (source, doc_id, start, ord), while they fit ``X_s``. The unit that would
   pass ``X_s`` (a source's *crossing* unit) is set aside for some sources and not others, so that the total
   falls short of Σ ``X_s`` as little as can be and passes it by at most :data:`PAD_TOL` of the phase's tokens
   (a source passing its share by one unit where another falls short, the fills place the other's units in
   its stead); a source left short then takes the next units of its order that still fit (:func:`set_aside`,
   ``"dither"``).
   Continuation pieces go first (:func:`keep_whole`): a unit with ``start`` > 0 is a piece of a long document
   whose first piece is another unit, so setting it aside drops part of a document, never a whole one. A source
   without enough such pieces (short documents only) gives its ``X_s`` to the sources with more: all of it,
   then at most half of :data:`WINDOW_TOL` of a 10-step window, then none (whole units by priority stand in for
   what the pieces do not cover); then the plain choice among all units.
3. **Check.** The remaining fills are dry-run again without the units set aside. The choice is kept only if
   they place at most :data:`PAD_TOL` of the phase's tokens fewer than the first dry run and keep the mixture:
   the phase's share error no worse than the first dry run's or :data:`PHASE_TOL`, and no source's phase total
   moved by more than :data:`WINDOW_TOL` of a 10-step window (a choice that gives a source's ``X_s`` to others
   may take the share error to :data:`SHIFT_TOL`). Else the next choice: the plain one, the same with no total
   passing Σ ``X_s``, then with no source passing its ``X_s`` (``"under"``); if none holds, the phase end drops
   what its last fill leaves, by length.

The units set aside are dropped at the phase end with whatever the last fill leaves (the carried units the
fills now place in their stead are the short ones the phase end would have dropped). Pure functions of their
arguments: the same plan gives the same drops, whatever the engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from mixing.plan.mixture import WINDOW

if TYPE_CHECKING:
    from mixing.pack.pool import Pool

__all__ = ["PAD_TOL", "PHASE_TOL", "SHIFT_TOL", "WINDOW_TOL", "drop_mask", "due", "keep_whole", "priority", "set_aside"]

PAD_TOL = 0.0005  # of the phase's tokens: the padding the choice may add (its packing efficiency, at most that less)
PHASE_TOL = 0.001  # a phase's share error the choice may reach (the goal is 0.002)
SHIFT_TOL = 0.0015  # the phase's share error moving a source's drop onto others' pieces may reach (goal 0.002)
WINDOW_TOL = 0.004  # of the last 10-step window's tokens: how far a source's total may move (the goal is 0.01)

_SALT = 0x5EED_D0C5_0F_A11  # any constant: the priorities are a fixed function of the plan's units
_U64 = np.uint64


def due(q_cum: np.ndarray, r_cum: np.ndarray, capacity: float) -> np.ndarray:
    """float64 [k]: each source's due tokens for the next ``capacity`` tokens of the phase, given its cumulative
    quota ``q_cum`` and the tokens placed so far ``r_cum``: ``q_cum·ρ − r_cum`` with ρ = (Σ r_cum + capacity) ÷
    Σ q_cum, so Σ due = capacity and placing them puts every source on its share (an equal split where the
    phase has no quota yet)."""
    total = q_cum.sum()
    if total <= 0:
        return np.full(len(q_cum), capacity / max(len(q_cum), 1))
    return q_cum * ((r_cum.sum() + capacity) / total) - r_cum  # type: ignore[no-any-return]


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 arrays (wrapping arithmetic)."""
    x = x + _U64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))  # type: ignore[no-any-return]


def priority(units: np.ndarray) -> np.ndarray:
    """uint64 [n]: each unit's drop priority, a hash of its (source, doc_id, start, ord), lowest set aside first.

    ``units`` int64 [n, 6] = (length, source, doc_id, start, step, ord). Independent of the length and of the
    step, so the choice is not one by length; the plan's seed moves it through doc_id and ord.
    """
    units = np.asarray(units, np.int64).reshape(-1, 6)
    h = np.full(len(units), _SALT, np.uint64)
    with np.errstate(over="ignore"):
        for c in (1, 2, 3, 5):
            h = _mix64(h ^ units[:, c].astype(np.uint64))
    return h


def set_aside(
    units: np.ndarray, targets: np.ndarray, *, rule: str, since: int = -(1 << 62), slack: float = 0.0
) -> np.ndarray:
    """bool [n]: per source, units planned at step ``since`` or later, in (latest step, lowest :func:`priority`)
    order, until their tokens reach that source's ``targets`` (float64 [k]).

    ``rule`` says what becomes of the unit that would pass a source's target (its *crossing* unit):
    ``"dither"``, set aside for some sources and not others, so that the tokens set aside pass no source's
    target by more than its crossing unit and their total never passes the targets' total (the sources taken
    in the order of their crossing units' :func:`priority`; a source whose crossing unit is left gives up less
    than its target, and the phase's last fill leaves the difference); ``"under"``, skipped, the next unit
    tried (never more than the target). ``units`` int64 [n, 6] = (length, source, doc_id, start, step, ord), in
    any order: the result is the same for the same units (ties of priority, which a 64-bit hash makes rare, go
    to the earlier row).
    """
    units = np.asarray(units, np.int64).reshape(-1, 6)
    out = np.zeros(len(units), np.bool_)
    t = np.asarray(targets, np.float64)
    pri = priority(units)
    order = np.lexsort((pri, -units[:, 4], units[:, 1]))  # source, latest step, priority; stable
    taken = np.zeros(len(t))
    crossing = np.full(len(t), -1, np.int64)  # per source: the row of the unit that would pass its target
    for r in order.tolist():  # a phase end's few thousand units, once per phase
        s, length = int(units[r, 1]), int(units[r, 0])
        if units[r, 4] < since or taken[s] >= t[s] or crossing[s] >= 0:
            continue
        if taken[s] + length <= t[s]:
            out[r] = True
            taken[s] += length
        elif rule == "dither":
            crossing[s] = r
    if rule == "dither":
        has = np.flatnonzero(crossing >= 0)
        extra = units[crossing[has], 0].astype(np.float64)
        pick = _dither(float((taken - t).sum()), extra, slack, pri[crossing[has]])
        out[crossing[has[pick]]] = True
        short = np.zeros(len(t), np.bool_)
        short[has[~pick]] = True  # these sources fall short of their targets: the units that still fit, in order,
        room = float(t.sum() - taken.sum() - extra[pick].sum())  # while the total stays within the targets'
        for r in order.tolist():
            s, length = int(units[r, 1]), int(units[r, 0])
            if short[s] and not out[r] and units[r, 4] >= since and taken[s] + length <= min(t[s], taken[s] + room):
                out[r] = True
                taken[s] += length
                room -= length
    return out


def _dither(over: float, extra: np.ndarray, slack: float, pri: np.ndarray) -> np.ndarray:
    """bool [m]: which crossing units (``extra`` tokens each) to set aside, given the tokens set aside beyond the
    targets without them, ``over`` (≤ 0): the total passes the targets by at most ``slack`` and falls short of
    them (what the last fill then leaves, by length) as little as can be, then passes them as little as can be.
    Every subset for up to 10 units; beyond, in the order of their ``pri`` while the total stays ≤ ``slack``."""
    m = len(extra)
    if m > 10:
        pick = np.zeros(m, np.bool_)
        for j in np.argsort(pri, kind="stable").tolist():
            if over + extra[j] <= slack:
                pick[j], over = True, over + extra[j]
        return pick
    subsets = (np.arange(1 << m)[:, None] >> np.arange(m)) & 1  # row b: subset b, the first found wins ties
    total = over + subsets @ extra
    short = np.where(total > slack, np.inf, np.maximum(-total, 0.0))  # the empty subset always qualifies
    best = int(np.lexsort((total, short))[0])
    return subsets[best].astype(np.bool_)


def _finish(
    pool: Pool, units: np.ndarray, q_cum: np.ndarray, r_cum: np.ndarray, later: np.ndarray, capacity: float, bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """Run the phase's remaining fills on ``pool`` (empty) given ``units``, as the packer does: (tokens placed
    per source over the phase, float64 [k]; tokens left per source, float64 [k])."""
    pool.add(units)
    q, r = q_cum.copy(), r_cum.copy()
    for j in range(len(later) + 1):
        if j:
            q += later[j - 1]
        segs = np.zeros((len(pool), 4), np.int64)
        _n, placed = pool.fill(due(q, r, capacity), segs, np.zeros(bins, np.int64))
        r += placed
    return r, _tokens(pool.take_all(), len(q))


def _tokens(units: np.ndarray, k: int) -> np.ndarray:
    """float64 [k]: the tokens of ``units`` per source."""
    return np.bincount(units[:, 1], weights=units[:, 0], minlength=k).astype(np.float64)


def _pieces(units: np.ndarray, since: int) -> np.ndarray:
    """bool [n]: the continuation pieces (``start`` > 0) of ``units`` planned at step ``since`` or later."""
    return (units[:, 3] > 0) & (units[:, 4] >= since)


def keep_whole(units: np.ndarray, targets: np.ndarray, *, since: int, slack: float, move: float) -> np.ndarray:
    """bool [n]: what :func:`set_aside` (``"dither"``) chooses, taken first among the *continuation pieces*
    (``start`` > 0: their document's first piece is another unit), so that a phase end drops no document whole
    where pieces can stand in. A source with fewer such tokens planned at ``since`` or later than its target
    gives up to ``move`` tokens of its shortfall to the sources with more (each taking at most ``move``, in
    proportion to their excess; :func:`drop_mask`'s mixture checks bound how far that moves any source). What
    the pieces cannot cover is set aside among the whole units as :func:`set_aside` would (by their priority,
    length-blind)."""
    units = np.asarray(units, np.int64).reshape(-1, 6)
    t = np.asarray(targets, np.float64)
    piece = _pieces(units, since)
    avail = _tokens(units[piece], len(t))
    give = np.minimum(t - np.minimum(t, avail), move)  # what each source lacks in pieces, up to move
    take = np.minimum(avail - np.minimum(t, avail), move)  # what each source has in pieces beyond its target
    amount = min(float(give.sum()), float(take.sum()))
    want = t - give * (amount / give.sum()) + take * (amount / take.sum()) if amount > 0 else t
    mask = np.zeros(len(units), np.bool_)
    mask[piece] = set_aside(units[piece], want, rule="dither", since=since, slack=slack)
    taken = _tokens(units[mask], len(t))
    rest, gap = np.maximum(t - taken, 0.0), float(t.sum() - taken.sum())
    if gap > 0 and rest.sum() > 0:  # what no piece covers: whole units, as the plain choice takes them
        whole = ~piece
        mask[whole] = set_aside(units[whole], rest * (gap / float(rest.sum())), rule="dither", since=since)
    return mask


def _share_error(r: np.ndarray, q: np.ndarray) -> float:
    if r.sum() <= 0 or q.sum() <= 0:
        return 0.0
    return float(np.abs(r / r.sum() - q / q.sum()).max())


def drop_mask(
    units: np.ndarray,
    new_pool: Callable[[], Pool],
    q_cum: np.ndarray,
    r_cum: np.ndarray,
    later: np.ndarray,
    capacity: float,
    bins: int,
    since: int,
    phase_steps: int,
) -> np.ndarray:
    """bool [n]: the units of ``units`` a phase end drops before its remaining fills (see the module docstring).

    ``units`` int64 [n, 6] = (length, source, doc_id, start, step, ord): every unit the phase has left, sorted
    by (step, source, ord, doc_id, start) (a pool's ``take_all``). ``new_pool``: an empty pool of the packer's
    engine, for the dry runs. ``q_cum``, ``r_cum`` float64 [k]: the phase's cumulative quotas up to and including
    the step about to be filled, and its tokens placed so far. ``later`` float64 [m, k]: the quotas of the phase's
    steps after that one (m = 0 or 1). ``capacity``: tokens per step; ``bins``: sequences per step; ``since``:
    the step about to be filled (only units planned there or later are set aside); ``phase_steps``: the phase's
    steps. Deterministic.
    """
    none = np.zeros(len(units), np.bool_)
    placed_a, left_a = _finish(new_pool(), units, q_cum, r_cum, later, capacity, bins)
    if left_a.sum() <= 0:
        return none
    q_end = q_cum + later.sum(axis=0)
    pad = PAD_TOL * phase_steps * capacity  # the padding the choice may add
    window = min(WINDOW, phase_steps) * capacity  # the tokens of the phase's last 10-step window
    worst = max(_share_error(placed_a, q_end), PHASE_TOL)
    piece = _pieces(units, since)  # what keep_whole may set aside first
    moves = (np.inf, WINDOW_TOL * window / 2, 0.0) if piece.any() else ()  # how far the pieces' rule may move a source
    tries = [*(("pieces", pad, m) for m in moves), ("dither", pad, 0.0), ("dither", 0.0, 0.0), ("under", 0.0, 0.0)]
    for rule, slack, move in tries:
        if rule == "pieces":
            mask = keep_whole(units, left_a, since=since, slack=slack, move=move)
            if not (mask & piece).any():  # no piece stands in: the plain choice's turn
                continue
        else:
            mask = set_aside(units, left_a, rule=rule, since=since, slack=slack)
        if not mask.any():
            continue
        placed_b, _left = _finish(new_pool(), units[~mask], q_cum, r_cum, later, capacity, bins)
        if (
            placed_b.sum() >= placed_a.sum() - pad
            and _share_error(placed_b, q_end) <= (max(worst, SHIFT_TOL) if move else worst)
            and float(np.abs(placed_b - placed_a).max()) <= WINDOW_TOL * window
        ):
            return mask
    return none
