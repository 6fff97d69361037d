"""``mixing/loss_policy.py``: the fit recovers a power law from its own curve, and the policies keep their bounds
and their order (a source still learning fast drawn more than one whose loss has flattened) whatever the log."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mixing.loss_policy import BOUNDS, POLICIES, Curve, Losses, fit_power_law


def _curve(eps: float, beta: float, alpha: float, n0: float = 1e4, steps: int = 50) -> Curve:
    """L = ε + β·n^(−α) at ``steps`` token counts, n0 tokens per step."""
    return tuple((n0 * k, eps + beta * (n0 * k) ** (-alpha)) for k in range(1, steps + 1))


@given(st.floats(0.0, 3.0), st.floats(0.5, 20.0), st.floats(0.05, 0.8), st.floats(1e2, 1e6), st.integers(3, 100))
def test_the_fit_gives_back_the_curve_it_was_fed(eps: float, beta: float, alpha: float, n0: float, steps: int) -> None:
    curve = _curve(eps, beta, alpha, n0, steps)
    fit = fit_power_law(curve)
    assert fit is not None
    e, b, a = fit
    assert 0 <= e < min(y for _, y in curve)
    worst = max(abs(e + b * n ** (-a) - y) / y for n, y in curve)
    assert worst < 0.01, (fit, worst)
    # where the loss still has a part to lose, the potential (α·β·n^(−α) at the end) is found too
    n = curve[-1][0]
    if beta * n ** (-alpha) > 0.05 * curve[-1][1] and steps >= 10:
        assert a * b * n ** (-a) == pytest.approx(alpha * beta * n ** (-alpha), rel=0.1)


def test_a_curve_with_too_few_token_counts_or_a_loss_of_zero_is_not_fitted() -> None:
    assert fit_power_law(((100.0, 3.0), (200.0, 2.5))) is None
    assert fit_power_law(((100.0, 3.0), (100.0, 2.9), (200.0, 2.5))) is None  # two distinct counts
    assert fit_power_law(((100.0, 3.0), (200.0, 0.0), (300.0, 2.5))) is None


def test_scaling_law_draws_the_source_still_learning_more_and_the_flat_one_half() -> None:
    losses = Losses(
        per_token={"fast": 3.0, "slow": 2.0, "flat": 2.5, "short": 1.0},
        curves={
            "fast": _curve(1.0, 200.0, 0.5),  # potential α·β·n^(−α) at n = 5e5: 0.1414
            "slow": _curve(1.5, 8.0, 0.3),  # 0.0468
            "flat": tuple((1e4 * k, 2.5) for k in range(1, 51)),
            "short": ((1e4, 1.0), (2e4, 0.9)),  # too short to fit: kept as it is
        },
    )
    f = POLICIES["scaling_law"](losses)
    assert f["fast"] > f["slow"] > f["flat"] == BOUNDS[0]
    mean = (0.14142 + 0.04683 + 0.0) / 3  # over the fitted sources, the flat one's 0 included
    assert f["fast"] == pytest.approx(min(BOUNDS[1], 0.14142 / mean), rel=0.02)
    assert f["slow"] == pytest.approx(max(BOUNDS[0], 0.04683 / mean), rel=0.02)
    assert f["short"] == 1.0
    assert POLICIES["scaling_law"](losses) == f  # a pure function of the log


_point = st.tuples(st.floats(1.0, 1e12), st.floats(1e-3, 20.0))


@given(st.dictionaries(st.sampled_from("abcde"), st.lists(_point, max_size=40), min_size=1))
def test_every_policy_keeps_its_bounds_whatever_the_log(curves: dict[str, list[tuple[float, float]]]) -> None:
    per_token = {s: (sum(y for _, y in c) / len(c) if c else 1.0) for s, c in curves.items()}
    losses = Losses(per_token, {s: tuple(sorted(c)) for s, c in curves.items()})
    for name, policy in POLICIES.items():
        factor = policy(losses)
        assert set(factor) == set(per_token), name
        assert all(math.isfinite(v) and BOUNDS[0] <= v <= BOUNDS[1] for v in factor.values()), (name, factor)
