"""mixing/mixfile/phase.py: a curriculum phase validates itself at the edge, and its length resolves to steps. A
phase's length is exactly one of ``steps`` (a count or a percentage) and ``tokens`` (a count or ``50M``-style),
within the limits that keep a build out of MemoryError, with one short message line whatever the value; a mixture
has a positive weight and its shares sum to 1; a transition's steps match its shape; with regrouping, every
phase is a whole number of template blocks.

(Every part frozen and closed: test_parts.py; the run's total steps and a ramp longer than its phase:
test_mix.py.)"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from mixing import MixError
from mixing.mixfile.balance import Regroup
from mixing.mixfile.locations import FieldError
from mixing.mixfile.mix import parse_mix
from mixing.mixfile.parts import MAX_STEPS, MAX_TOKENS, SequenceSpec
from mixing.mixfile.phase import Phase, Transition, resolve_steps
from tests.mixing.mixfile.test_mix import GOOD
from tests.mixing.mixfile.test_parts import refusal


def phase(**fields: Any) -> Phase:
    return Phase(**{"phase": "p", "mixture": {"a": 1.0}, **fields})


# --- a phase's length --------------------------------------------------------------------------------------------

ANYTHING = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=10**300, max_value=10**400),
    st.floats(),
    st.text(max_size=20),
    st.text(min_size=200, max_size=2000),
    st.sampled_from(["15%", "0%", "100%", "99.5%", " 7 % ", "50M", "1.5b", "0K", "1e9", "12X", "-5%", "9" * 30 + "T"]),
    st.lists(st.integers(), max_size=3),
)


@given(ANYTHING)
def test_steps_is_a_count_or_a_share_of_the_run_within_limits(value: Any) -> None:
    try:
        ph = phase(steps=value)
    except ValidationError as e:
        (err,) = e.errors()
        assert "\n" not in err["msg"] and len(err["msg"]) < 300  # one short line, however long the value
        return
    assert value is not None and not isinstance(value, bool)  # True is an int to Python, never a number of steps
    if isinstance(value, int):
        assert 0 < value <= MAX_STEPS and ph.percent is None
    else:
        assert isinstance(value, str) and ph.percent is not None and 0 < ph.percent < 100
        assert math.isclose(ph.percent, float(value.strip().removesuffix("%")))
    assert ph.token_count() is None


@given(ANYTHING)
def test_tokens_is_a_count_within_limits(value: Any) -> None:
    try:
        ph = phase(tokens=value)
    except ValidationError as e:
        (err,) = e.errors()
        assert "\n" not in err["msg"] and len(err["msg"]) < 300
        return
    assert value is not None and not isinstance(value, bool) and ph.percent is None
    n = ph.token_count()
    assert n is not None and 0 < n <= MAX_TOKENS
    if isinstance(value, int):
        assert n == value


@given(
    st.integers(1, 10**6),
    st.sampled_from([("", 1), ("K", 10**3), ("M", 10**6), ("B", 10**9), ("T", 10**12)]),
    st.booleans(),
    st.sampled_from(["", ".5", ".25"]),
)
def test_a_token_count_expands_its_suffix(n: int, suffix: tuple[str, int], lower: bool, frac: str) -> None:
    letter, scale = suffix
    text = f"{n}{frac}{letter.lower() if lower else letter}"
    expected = round(float(f"{n}{frac}") * scale)
    if expected > MAX_TOKENS:
        assert "limit of 1e+16 tokens" in refusal(Phase, phase="p", mixture={"a": 1}, tokens=text)
        return
    assert phase(tokens=text).token_count() == expected


def test_limits_are_inclusive_and_one_past_them_is_refused() -> None:
    assert phase(steps=MAX_STEPS).steps == MAX_STEPS
    assert "limit of 10,000,000 steps" in refusal(Phase, phase="p", mixture={"a": 1}, steps=MAX_STEPS + 1)
    assert phase(tokens=MAX_TOKENS).token_count() == MAX_TOKENS
    assert phase(tokens="10000T").token_count() == MAX_TOKENS
    assert "limit of 1e+16 tokens" in refusal(Phase, phase="p", mixture={"a": 1}, tokens=MAX_TOKENS + 1)
    assert "limit of 1e+16 tokens" in refusal(Phase, phase="p", mixture={"a": 1}, tokens="10001T")


def test_a_phase_has_exactly_one_length() -> None:
    for fields in ({}, {"steps": 3, "tokens": "1M"}):
        assert "exactly one of 'steps' or 'tokens'" in refusal(Phase, phase="p", mixture={"a": 1}, **fields)


# --- mixtures, names, transitions ---------------------------------------------------------------------------------

WEIGHTS = st.dictionaries(
    st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True),
    st.floats(0, 1e6, allow_nan=False, allow_infinity=False),
    max_size=6,
)


@given(WEIGHTS)
def test_a_mixture_with_a_positive_weight_has_shares_summing_to_one(weights: dict[str, float]) -> None:
    if sum(weights.values()) <= 0:
        msg = refusal(Phase, phase="p", mixture=weights, steps=1)
        assert "mixture is empty" in msg or "all 0" in msg
        return
    shares = phase(mixture=weights, steps=1).shares
    assert shares.keys() == weights.keys() and math.isclose(sum(shares.values()), 1.0)
    total = sum(weights.values())
    assert all(math.isclose(shares[k], w / total, abs_tol=1e-12) for k, w in weights.items())


@pytest.mark.parametrize("weight", [-0.1, math.nan, math.inf, -math.inf])
def test_a_weight_is_a_finite_non_negative_number(weight: float) -> None:
    with pytest.raises(ValidationError):
        phase(mixture={"a": 1.0, "b": weight}, steps=1)


@pytest.mark.parametrize("name", ["", "1st", "warm-up", "a b", "é", "x.y"])
def test_a_phase_name_is_an_identifier(name: str) -> None:
    with pytest.raises(ValidationError):
        phase(phase=name, steps=1)


@given(st.sampled_from(["step", "linear", "cosine"]), st.integers(-3, MAX_STEPS + 3))
def test_a_step_transition_has_no_ramp_and_a_ramp_has_steps(shape: str, steps: int) -> None:
    valid = 0 <= steps <= MAX_STEPS and (steps == 0 if shape == "step" else steps >= 1)
    if valid:
        assert Transition(shape=shape, steps=steps).steps == steps  # type: ignore[arg-type]
    else:
        refusal(Transition, shape=shape, steps=steps)


# --- a curriculum's lengths in steps ------------------------------------------------------------------------------

SEQ = SequenceSpec(length=128, global_batch=2)  # 256 tokens per step


def test_a_percentage_is_a_share_of_the_whole_run_itself_included() -> None:
    curriculum = [phase(steps=85), phase(phase="anneal", steps="15%")]
    assert resolve_steps(curriculum, SEQ, None) == (85, 15)
    assert resolve_steps([phase(tokens=2500), phase(phase="q", steps="50%")], SEQ, None) == (10, 10)  # ⌈2500/256⌉
    for lengths, words in [(("50%", "50%"), "sum to 100%"), (("10%", "20%"), "every phase is a percentage")]:
        with pytest.raises(FieldError) as e:
            resolve_steps([phase(phase=f"p{i}", steps=s) for i, s in enumerate(lengths)], SEQ, None)
        assert e.value.loc == ("curriculum", 1, "steps") and words in e.value.msg


def test_regrouping_makes_every_phase_whole_blocks() -> None:
    curriculum = [phase(tokens=2500), phase(phase="q", steps="20%")]
    assert resolve_steps(curriculum, SEQ, Regroup(window=4, period=4)) == (12, 4)
    with pytest.raises(FieldError) as e:
        resolve_steps([phase(steps=10)], SEQ, Regroup(period=4))
    assert e.value.loc == ("curriculum", 0, "steps") and "expected 8 or 12" in e.value.msg


def test_regrouping_aligns_every_phase_to_whole_template_blocks() -> None:
    text = GOOD.replace("steps: 10", "tokens: 2500").replace("steps: 5", "steps: '20%'")
    text += "balance:\n  regroup: {window: 4, period: 4}\n"
    mix = parse_mix(text, "good.yaml")  # 2500 tokens = 10 steps of 256 → 12; 20% of the run → 4 (one block)
    assert mix.phase_steps == (12, 4)
    assert mix.balance.regroup is not None and mix.balance.regroup.slack == 1.15
    assert parse_mix(GOOD.replace("steps: 10", "tokens: 2500"), "good.yaml").phase_steps[0] == 10  # no regroup


def test_steps_that_are_not_whole_template_blocks_name_the_phase() -> None:
    text = GOOD + "balance:\n  regroup: {period: 4}\n"
    with pytest.raises(MixError) as e:
        parse_mix(text, "bad.yaml")
    assert "bad.yaml:8: curriculum[0].steps" in str(e.value) and "expected 8 or 12" in str(e.value)
    with pytest.raises(MixError, match=r"bad.yaml:16: balance.regroup.slack"):
        parse_mix(GOOD + "balance:\n  regroup: {period: 5, slack: 0.5}\n", "bad.yaml")
