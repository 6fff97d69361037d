"""The curriculum in the mix file: phase lengths, ramps, length limits, normalization, and their errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixing import MixError
from mixing.mixfile.mix import parse_mix
from mixing.plan.curriculum import phase_spans, ramp, step_shares
from mixing.plan.quotas import step_quotas

HEAD = """\
name: c
sequence: {length: 128, global_batch: 4}
sources:
  a: {uri: "x/*.txt"}
  b: {uri: "y/*.txt"}
  c: {uri: "z/*.txt"}
curriculum:
"""


def mix_of(*phases: str):  # type: ignore[no-untyped-def]
    return parse_mix(HEAD + "".join(f"  - {p}\n" for p in phases), "c.yaml")


def test_phase_lengths_in_steps_percent_and_tokens() -> None:
    m = mix_of(
        "{phase: warm, steps: 10, mixture: {a: 1}}",
        "{phase: main, tokens: 50K, mixture: {a: 0.5, b: 0.5}}",  # 50000 / 512 → 98 steps (rounded up)
        "{phase: anneal, steps: 20%, mixture: {c: 1}}",  # 20% of the whole run: 108 / 0.8 · 0.2 = 27
    )
    assert m.phase_steps == (10, 98, 27)
    assert m.total_steps == 135
    spans = phase_spans(m)
    assert [(s.first_step, s.end_step) for s in spans] == [(0, 10), (10, 108), (108, 135)]


def test_unnormalized_weights_need_normalize() -> None:
    with pytest.raises(MixError, match=r"c\.yaml:8: curriculum\[0\]\.mixture: .*sum to 3.*normalize: true"):
        mix_of("{phase: p, steps: 5, mixture: {a: 2, b: 1}}")
    m = mix_of("{phase: p, steps: 5, mixture: {a: 2, b: 1}, normalize: true}")
    assert m.curriculum[0].shares == pytest.approx({"a": 2 / 3, "b": 1 / 3})
    top = parse_mix(
        HEAD.replace("curriculum:", "normalize: true\ncurriculum:")
        + "  - {phase: p, steps: 5, mixture: {a: 3, b: 1}}\n"
    )
    assert top.curriculum[0].shares == pytest.approx({"a": 0.75, "b": 0.25})


@pytest.mark.parametrize(
    ("phases", "line", "field", "words"),
    [
        (["{phase: p, mixture: {a: 1}}"], 8, "curriculum[0]", "exactly one of 'steps' or 'tokens'"),
        (["{phase: p, steps: 3, tokens: 9, mixture: {a: 1}}"], 8, "curriculum[0]", "exactly one"),
        (["{phase: p, steps: 0, mixture: {a: 1}}"], 8, "curriculum[0].steps", "greater than 0"),
        (["{phase: p, steps: 120%, mixture: {a: 1}}"], 8, "curriculum[0].steps", "percentage"),
        (["{phase: p, tokens: lots, mixture: {a: 1}}"], 8, "curriculum[0].tokens", "'50M'"),
        (["{phase: p, steps: 50%, mixture: {a: 1}}"], 8, "curriculum[0].steps", "at least one phase in steps"),
        (
            [
                "{phase: p, steps: 5, mixture: {a: 1}}",
                "{phase: q, steps: 60%, mixture: {a: 1}}",
                "{phase: r, steps: 40%, mixture: {b: 1}}",
            ],
            10,
            "curriculum[2].steps",
            "sum to 100%",
        ),
        (
            [
                "{phase: p, steps: 5, mixture: {a: 1}}",
                "{phase: q, steps: 3, mixture: {b: 1}, transition: {shape: linear, steps: 4}}",
            ],
            9,
            "curriculum[1].transition.steps",
            "ramp is 4 steps but the phase has only 3",
        ),
        (
            [
                "{phase: p, steps: 5, mixture: {a: 1}}",
                "{phase: q, steps: 5, mixture: {b: 1}, transition: {shape: cosine}}",
            ],
            9,
            "curriculum[1].transition",
            "needs steps ≥ 1",
        ),
        (
            ["{phase: p, steps: 5, mixture: {a: 1}, transition: {shape: linear, steps: 2}}"],
            8,
            "curriculum[0].transition",
            "no previous mixture",
        ),
        (["{phase: p, steps: 5, mixture: {a: 1}, max_doc_tokens: 0}"], 8, "curriculum[0].max_doc_tokens", "greater"),
        (["{phase: p, steps: 5, mixture: {a: 0}, normalize: true}"], 8, "curriculum[0].mixture", "all 0"),
        (["{phase: p, steps: 5, mixture: {a: 1}, maxdoc: 3}"], 8, "curriculum[0].maxdoc", "unknown field"),
    ],
)
def test_curriculum_errors_name_line_and_field(phases: list[str], line: int, field: str, words: str) -> None:
    with pytest.raises(MixError) as e:
        mix_of(*phases)
    msg = str(e.value)
    assert msg.startswith(f"c.yaml:{line}: {field}: "), msg
    assert words in msg, msg


def test_block_style_fields_point_at_their_own_line() -> None:
    text = HEAD + (
        "  - {phase: p, steps: 5, mixture: {a: 1}}\n"
        "  - phase: q\n"
        "    steps: 5\n"
        "    mixture: {b: 1}\n"
        "    transition:\n"
        "      shape: linear\n"
        "      steps: 9\n"
    )
    with pytest.raises(MixError, match=r"^c\.yaml:14: curriculum\[1\]\.transition\.steps: "):
        parse_mix(text, "c.yaml")


def test_ramp_shapes() -> None:
    assert ramp("linear", 4).tolist() == [0.125, 0.375, 0.625, 0.875]
    cos = ramp("cosine", 5)
    assert np.all(np.diff(cos) > 0) and 0 < cos[0] < 0.5 < cos[-1] < 1
    assert cos[2] == pytest.approx(0.5)


_weights = st.dictionaries(st.sampled_from("abc"), st.integers(0, 9), min_size=1).filter(lambda d: sum(d.values()) > 0)


@st.composite
def curricula(draw: st.DrawFn) -> str:
    out = []
    for i in range(draw(st.integers(1, 4))):
        w = draw(_weights)
        steps = draw(st.integers(1, 30))
        weights = ", ".join(f"{k}: {v}" for k, v in w.items())
        line = f"{{phase: p{i}, steps: {steps}, normalize: true, mixture: {{{weights}}}"
        if i and draw(st.booleans()):
            shape = draw(st.sampled_from(["linear", "cosine", "step"]))
            n = 0 if shape == "step" else draw(st.integers(1, steps))
            line += f", transition: {{shape: {shape}, steps: {n}}}"
        out.append(line + "}")
    return HEAD + "".join(f"  - {p}\n" for p in out)


@settings(max_examples=60)
@given(curricula())
def test_phases_and_ramps_land_on_declared_steps(text: str) -> None:
    mix = parse_mix(text)
    sch = step_shares(mix)
    assert sch.shares.shape == (mix.total_steps, 3)
    assert np.allclose(sch.shares.sum(axis=1), 1.0)
    prev = None
    for k, (ph, span) in enumerate(zip(mix.curriculum, sch.spans, strict=True)):
        rows = slice(span.first_step, span.end_step)
        assert (sch.phase[rows] == k).all()
        target = np.array([ph.shares.get(s, 0.0) for s in sch.sources])
        # from first_step + ramp_steps on, exactly the phase's own mixture
        assert np.array_equal(
            sch.shares[span.first_step + span.ramp_steps : span.end_step],
            np.tile(target, (span.steps - span.ramp_steps, 1)),
        )
        if span.ramp_steps and prev is not None:
            ramp_rows = sch.shares[span.first_step : span.first_step + span.ramp_steps]
            lo, hi = np.minimum(prev, target), np.maximum(prev, target)
            assert ((ramp_rows >= lo - 1e-12) & (ramp_rows <= hi + 1e-12)).all()
            moving = prev != target
            # strictly between and monotone towards the target for every source whose share changes
            assert ((ramp_rows[:, moving] > lo[moving]) & (ramp_rows[:, moving] < hi[moving])).all()
            d = np.diff(np.vstack([prev, ramp_rows, target]), axis=0) * np.sign(target - prev)
            assert (d >= -1e-12).all()
        prev = target
    # quotas: cumulative rounding keeps every prefix within half a token of the ideal
    q = step_quotas(mix)
    cap = mix.sequence.length * mix.sequence.global_batch
    quota = q["quota"].to_numpy().reshape(mix.total_steps, 3)
    assert (quota >= 0).all()
    ideal = np.cumsum(sch.shares * cap, axis=0)
    assert np.abs(np.cumsum(quota, axis=0) - ideal).max() <= 0.5 + 1e-6
    assert q.filter(q["step"] == mix.total_steps - 1)["phase"][0] == mix.curriculum[-1].phase
    assert math.isclose(quota.sum(), mix.total_steps * cap, abs_tol=3)
