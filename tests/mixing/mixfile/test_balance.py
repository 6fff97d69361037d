"""mixing/mixfile/balance.py: the mix file's ``balance`` section validates itself at the edge. A cost is the
build contract's cost model of its non-negative finite weights, takes the hybrid deal's terms and keeps their
defaults out of the fingerprint; a bad term names its line and field; regrouping's defaults are the ones the build
records; a token budget is only for unequal micro-batches.

(Every part frozen and closed: test_parts.py; a budget smaller than a sequence, and steps that are not whole
regrouping blocks: test_mix.py and test_phase.py.)"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from contract.cost import CostModel
from contract.record import Regroup as RecordedRegroup
from mixing import MixError
from mixing.mixfile.balance import Balance, Cost, Regroup
from mixing.mixfile.mix import parse_mix
from tests.mixing.mixfile.test_parts import refusal


@given(st.floats(allow_nan=True), st.floats(allow_nan=True))
def test_a_cost_is_the_cost_model_of_its_non_negative_finite_weights(attention: float, linear: float) -> None:
    if all(math.isfinite(x) and x >= 0 for x in (attention, linear)):
        assert Cost(attention=attention, linear=linear).model() == CostModel(attention, linear)
    else:
        with pytest.raises(ValidationError):
            Cost(attention=attention, linear=linear)


def test_regroup_defaults_are_the_ones_the_build_records() -> None:
    recorded = RecordedRegroup()
    assert (Regroup().window, Regroup().period, Regroup().slack) == (recorded.window, recorded.period, recorded.slack)
    refusal(Regroup, window=1)
    refusal(Regroup, slack=0.99)
    refusal(Regroup, period=0)


def test_a_token_budget_is_only_for_unequal_micro_batches() -> None:
    assert Balance(micro_batches="unequal", max_tokens=4096).max_tokens == 4096
    assert "micro_batches: unequal" in refusal(Balance, max_tokens=4096)


# --- balance.cost: the hybrid deal's terms ------------------------------------------------------------------------

COST_MIX = """\
name: m
sequence: {{length: 64, global_batch: 2}}
sources:
  a: {{uri: "x/*.txt"}}
curriculum:
  - {{phase: one, steps: 2, mixture: {{a: 1}}}}
balance:
  cost:
    attention: 1
{extra}"""


def test_a_cost_takes_the_hybrid_fields_and_keeps_its_defaults_out_of_the_fingerprint() -> None:
    given_mix = parse_mix(
        COST_MIX.format(
            extra="    per_document: 5\n    per_micro_batch: 1e6\n    unit_seconds: 1.0e-9\n    comm_bytes: 524288\n"
            "    intra_bandwidth: [300e9, 2.0e+11]\n    inter_bandwidth: [25e9]\n    group_latency: 0.00002\n"
        ),
        "m.yaml",
    )
    model = given_mix.balance.cost.model()
    assert model == CostModel(
        1.0,
        8192.0,
        per_document=5.0,
        per_micro_batch=1e6,
        unit_seconds=1e-9,
        comm_bytes=524288.0,
        intra_bandwidth=(300e9, 2e11),
        inter_bandwidth=(25e9,),
        group_latency=2e-5,
    )
    plain = parse_mix(COST_MIX.format(extra=""), "m.yaml")
    stated = parse_mix(COST_MIX.format(extra="    comm_bytes: 1048576\n    group_latency: 0\n"), "m.yaml")
    assert plain.balance.cost.model() == stated.balance.cost.model() == CostModel(1.0, 8192.0)
    assert plain.fingerprint() == stated.fingerprint() != given_mix.fingerprint()  # defaults leave it unchanged
    assert Cost().model_dump() == {"attention": 1.0, "linear": 8192.0}


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ("    per_document: -1\n", "balance.cost.per_document"),
        ("    per_micro_batch: .inf\n", "balance.cost.per_micro_batch"),
        ("    unit_seconds: 0\n", "balance.cost.unit_seconds"),
        ("    comm_bytes: many\n", "balance.cost.comm_bytes"),
        ("    intra_bandwidth: []\n", "balance.cost.intra_bandwidth"),
        ("    intra_bandwidth: [1e9, 0]\n", r"balance.cost.intra_bandwidth\[1\]"),
        ("    inter_bandwidth: fast\n", "balance.cost.inter_bandwidth"),
        ("    group_latency: -0.1\n", "balance.cost.group_latency"),
        ("    comm_byte: 3\n", "balance.cost.comm_byte: unknown field 'comm_byte'; did you mean 'comm_bytes'"),
    ],
)
def test_a_bad_hybrid_cost_field_names_its_line_and_field(extra: str, field: str) -> None:
    with pytest.raises(MixError, match=rf"^m\.yaml:10: {field}"):
        parse_mix(COST_MIX.format(extra=extra), "m.yaml")
