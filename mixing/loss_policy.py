"""The named rules by which a continuation's feedback (:mod:`mixing.feedback`) turns a run's losses into a factor
per source: what ``weir build --feedback LOSSES --policy NAME`` applies to the weights of the phases from the switch
on (each phase's weights × factor, renormalized).

A policy sees :class:`Losses`, the log as the feedback read it: each source's loss per token averaged over the
window before the switch, and each source's *curve* over that window (per logged step with tokens of the source,
the tokens of the source trained through that step, counted over every logged step from the log's start, and the
loss per token at that step). It returns a factor > 0 for every source of ``per_token``. Policies are pure
functions of their input in plain float arithmetic, so the same log gives the same factors (and the feedback
rounds them to 1e-6 before they reach the mix).

- ``loss_proportional``: factor = loss_s ÷ the mean of the sources' losses per token, clipped to [½, 2]: a source
  whose loss is above the mean is drawn more, one below it less, never more than twice or less than half its
  weight.
- ``scaling_law`` (after ADO, Jiang et al., "Adaptive Data Optimization", ICLR 2025): per source, the power law
  L(n) = ε + β·n^(−α) is fitted to its curve (n: the source's tokens trained; :func:`fit_power_law`), and the
  source's *learning potential* is α·(L̂ − ε), the loss the fit expects it to lose per e-fold of its tokens at
  the window's end (ADO's forecast −dL/dn, times the tokens a source's share brings). factor = potential ÷ the
  mean potential of the fitted sources, clipped to [½, 2]: a source still learning fast is drawn more, one
  whose loss has flattened (α ≤ 0: potential 0) half as much. A source whose curve cannot be fitted (fewer than
  :data:`MIN_POINTS` distinct token counts) keeps factor 1, and so does every source when no curve can be
  fitted or none still falls.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["BOUNDS", "GRID", "MIN_POINTS", "POLICIES", "Curve", "Losses", "Policy", "fit_power_law"]

BOUNDS = (0.5, 2.0)  # every policy's factor stays within these: no source more than doubled or halved
MIN_POINTS = 3  # distinct token counts a curve needs for scaling_law to fit it (three parameters)
GRID = 64  # values of ε tried in [0, the curve's lowest loss): the fit's resolution of the loss floor

Curve = tuple[tuple[float, float], ...]
"""(tokens of the source trained through a step, its loss per token at that step), in step order."""


@dataclass(frozen=True)
class Losses:
    """What a policy sees: ``per_token`` (source → loss per token over the window, rounded to 1e-6) and
    ``curves`` (source → its :data:`Curve` over the window; empty tuple where the log has none)."""

    per_token: dict[str, float]
    curves: dict[str, Curve]


Policy = Callable[[Losses], dict[str, float]]
"""``policy(losses)`` → factor by source (every source of ``losses.per_token``, within :data:`BOUNDS`)."""


def _clip(x: float) -> float:
    return min(BOUNDS[1], max(BOUNDS[0], x))


def _loss_proportional(losses: Losses) -> dict[str, float]:
    loss = losses.per_token
    mean = sum(loss.values()) / len(loss) if loss else 0.0
    return {s: _clip(v / mean) if mean > 0 else 1.0 for s, v in loss.items()}


def fit_power_law(curve: Curve) -> tuple[float, float, float] | None:
    """(ε, β, α) of L(n) = ε + β·n^(−α) fitted to ``curve``, or None with fewer than :data:`MIN_POINTS` distinct
    token counts, or a loss ≤ 0. For a given ε, log(L − ε) against log n is a line (least squares: slope −α,
    intercept log β); ε is searched over :data:`GRID` values in [0, min L), then over :data:`GRID` values around
    the best of them, keeping the one whose curve is closest to the losses (sum of squared errors; the lower ε on
    a tie). Deterministic: plain float arithmetic in a fixed order."""
    points = [(n, y) for n, y in curve if n > 0]
    if len({n for n, _ in points}) < MIN_POINTS or any(y <= 0 for _, y in points):
        return None
    floor = min(y for _, y in points)
    xs = [math.log(n) for n, _ in points]  # the line's abscissae, the same for every ε
    mx = sum(xs) / len(xs)
    dx = [x - mx for x in xs]
    sxx = sum(d * d for d in dx)

    def line(eps: float) -> tuple[float, float, float, float]:
        """(sum of squared errors, ε, β, α) of the least-squares line through (log n, log(L − ε)); the error is
        infinite where the line's curve overflows a float (a log no power law fits)."""
        ys = [math.log(y - eps) for _, y in points]
        my = sum(ys) / len(ys)
        slope = sum(d * v for d, v in zip(dx, ys, strict=True)) / sxx
        try:
            beta, alpha = math.exp(my - slope * mx), -slope
            return sum((eps + beta * n ** (-alpha) - y) ** 2 for n, y in points), eps, beta, alpha
        except OverflowError:
            return math.inf, eps, 0.0, 0.0

    step = floor / GRID
    best = min(line(step * k) for k in range(GRID))
    finer = (best[1] + step * (2 * k - GRID) / GRID for k in range(1, GRID))  # the steps either side of the best
    best = min([best, *(line(eps) for eps in finer if 0 <= eps < floor)])
    return (best[1], best[2], best[3]) if math.isfinite(best[0]) else None


def _potential(curve: Curve) -> float | None:
    """α·(L̂ − ε) at the curve's last token count (0 where the loss does not fall), None where no fit."""
    fit = fit_power_law(curve)
    if fit is None:
        return None
    _eps, beta, alpha = fit  # L̂ − ε = β·n^(−α)
    potential = alpha * beta * curve[-1][0] ** (-alpha) if alpha > 0 else 0.0
    return potential if math.isfinite(potential) else None  # β·n^(−α) past a float's range: no fit to trust


def _scaling_law(losses: Losses) -> dict[str, float]:
    potential = {s: _potential(losses.curves.get(s, ())) for s in losses.per_token}
    fitted = [p for p in potential.values() if p is not None]
    mean = sum(fitted) / len(fitted) if fitted else 0.0
    return {s: 1.0 if p is None or mean <= 0 else _clip(p / mean) for s, p in potential.items()}


POLICIES: dict[str, Policy] = {"loss_proportional": _loss_proportional, "scaling_law": _scaling_law}
