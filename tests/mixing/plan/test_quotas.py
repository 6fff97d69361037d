"""``mixing/plan/quotas.py``: quotas are int64, step-major with sources by name, their prefix sums within 0.5 token
of the ideal; what the fit holds back comes off the steps it names (or its phase's steps before them), within
each step's quota, and changes no quota."""

from __future__ import annotations

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from mixing.mixfile.mix import Mix
from mixing.plan.curriculum import phase_spans
from mixing.plan.quotas import step_quotas
from tests.mixing.plan.test_curriculum_plan import same_frame
from tests.mixing.plan.test_plan import planned_mixes


@settings(max_examples=60)
@given(planned_mixes())
def test_step_quotas_carry_rounding_forward(case: tuple[Mix, dict[str, np.ndarray]]) -> None:
    mix, _ = case
    q = step_quotas(mix)
    spans = phase_spans(mix)
    names, steps = sorted(mix.sources), sum(sp.steps for sp in spans)
    assert q.columns == ["step", "phase", "source", "quota", "cum_quota", "share", "held"]
    assert q.schema["quota"] == q.schema["cum_quota"] == q.schema["step"] == q.schema["held"] == pl.Int64
    assert (q["held"] == 0).all(), "nothing held back unless asked"
    assert q["step"].to_list() == [t for t in range(steps) for _ in names], "step-major"
    assert q["source"].to_list() == names * steps, "sources by name within a step"
    phase_of = [sp.name for sp in spans for _ in range(sp.steps)]
    assert q["phase"].to_list() == [p for p in phase_of for _ in names]

    cap = mix.sequence.length * mix.sequence.global_batch
    quota = q["quota"].to_numpy().reshape(steps, len(names))
    share = q["share"].to_numpy().reshape(steps, len(names))
    assert (quota >= 0).all()
    assert np.allclose(share.sum(axis=1), 1.0), "each step's shares make the whole batch"
    assert np.array_equal(np.cumsum(quota, axis=0), q["cum_quota"].to_numpy().reshape(steps, len(names)))
    ideal = np.cumsum(share * cap, axis=0)
    assert np.abs(np.cumsum(quota, axis=0) - ideal).max(initial=0) <= 0.5 + 1e-6 * cap * max(steps, 1)


@settings(max_examples=60)
@given(planned_mixes(), st.data())
def test_held_tokens_come_off_the_step_named_or_the_steps_of_its_phase_before_it(
    case: tuple[Mix, dict[str, np.ndarray]], data: st.DataObject
) -> None:
    """What the fit holds back (:func:`mixing.plan.fit.fit`: the units a phase's packing dropped, at the steps
    that drew them): each step's held within its quota, a phase's held the sum asked of it (its demand at most),
    nothing held after the last step named in the phase (unless all of the phase through it was) nor in another
    phase, and the quotas unchanged."""
    mix, _ = case
    base = step_quotas(mix)
    names, steps = sorted(mix.sources), mix.total_steps
    quota = base["quota"].to_numpy().reshape(steps, len(names))
    picks = data.draw(
        st.lists(
            st.tuples(st.integers(0, steps - 1), st.sampled_from(names), st.integers(1, 3 * int(quota.max()) + 1)),
            max_size=6,
        )
    )
    asked: dict[tuple[int, str], int] = {}
    for step, source, tokens in picks:
        asked[step, source] = asked.get((step, source), 0) + tokens
    q = step_quotas(mix, asked)
    assert same_frame(q.drop("held"), base.drop("held")), "held changes no quota"
    held = q["held"].to_numpy().reshape(steps, len(names))
    assert ((held >= 0) & (held <= quota)).all()
    for sp in phase_spans(mix):
        for i, source in enumerate(names):
            mine = {t: v for (t, s), v in asked.items() if s == source and sp.first_step <= t < sp.end_step}
            got = held[sp.first_step : sp.end_step, i]
            demand = int(quota[sp.first_step : sp.end_step, i].sum())
            assert got.sum() == min(sum(mine.values()), demand), (sp.name, source)
            through = max(mine, default=sp.first_step) - sp.first_step + 1
            if got[:through].sum() < quota[sp.first_step : sp.first_step + through, i].sum():
                assert not got[through:].any(), "nothing held after the last step named, unless all before it was"
