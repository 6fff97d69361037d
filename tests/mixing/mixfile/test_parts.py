"""mixing/mixfile/parts.py: each part of a mix file validates itself at the edge. Frozen and closed models; a
phase's length is exactly one of ``steps`` (a count or a percentage) and ``tokens`` (a count or ``50M``-style),
within the limits that keep a build out of MemoryError, with one short message line whatever the value; a
mixture has a positive weight and its shares sum to 1; transitions, sequences, tokenizers, encodings and
templates hold their own rules; the render fingerprint moves with exactly the fields that decide documents.

(The mix file as a whole, with file, line and field: test_mix.py and test_mix_fuzz.py; template and encoding
refusals through a mix file: tests/faults/test_ingest_records.py.)"""

from __future__ import annotations

import codecs
import math
import re
import string
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from contract.cost import CostModel
from contract.manifest import Regroup as RecordedRegroup
from mixing import MixError
from mixing.mixfile.mix import parse_mix
from mixing.mixfile.parts import (
    MAX_STEPS,
    MAX_TOKENS,
    MAX_TOKENS_PER_STEP,
    Balance,
    Cost,
    Phase,
    Regroup,
    SequenceSpec,
    SourceSpec,
    TokenizerSpec,
    Transition,
)


def refusal(model: type[BaseModel], **fields: Any) -> str:
    """The messages a model's validation gives ``fields``, each one line of bounded length, joined."""
    with pytest.raises(ValidationError) as e:
        model(**fields)
    msgs = [str(err["msg"]) for err in e.value.errors()]
    assert all("\n" not in m and len(m) < 300 for m in msgs), msgs
    return " | ".join(msgs)


def phase(**fields: Any) -> Phase:
    return Phase(**{"phase": "p", "mixture": {"a": 1.0}, **fields})


# --- frozen, closed models ---------------------------------------------------------------------------------------

EXAMPLES: list[BaseModel] = [
    TokenizerSpec(),
    SequenceSpec(length=64, global_batch=2),
    SourceSpec(uri="x"),
    phase(steps=3),
    Transition(shape="linear", steps=2),
    Cost(),
    Regroup(),
    Balance(),
]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_part_is_frozen_and_refuses_unknown_fields(example: BaseModel) -> None:
    name = next(iter(type(example).model_fields))
    with pytest.raises(ValidationError):
        setattr(example, name, getattr(example, name))
    fields = example.model_dump()
    assert type(example)(**fields) == example  # a part round-trips through its fields
    with pytest.raises(ValidationError) as e:
        type(example)(**fields, unknwon=1)
    assert [err["type"] for err in e.value.errors()] == ["extra_forbidden"]


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


# --- sequence, tokenizer, cost, balance ---------------------------------------------------------------------------


@given(st.integers(-2, (1 << 24) + 2), st.integers(-2, (1 << 20) + 2))
def test_a_step_holds_at_most_2_to_the_28_tokens(length: int, global_batch: int) -> None:
    ok = 8 <= length <= 1 << 24 and 1 <= global_batch <= 1 << 20 and length * global_batch <= MAX_TOKENS_PER_STEP
    if ok:
        seq = SequenceSpec(length=length, global_batch=global_batch)
        assert seq.length * seq.global_batch <= MAX_TOKENS_PER_STEP
        return
    msg = refusal(SequenceSpec, length=length, global_batch=global_batch)
    if 8 <= length <= 1 << 24 and 1 <= global_batch <= 1 << 20:
        assert f"{length * global_batch:,} tokens per step" in msg


def test_a_tokenizer_names_what_it_loads() -> None:
    assert "needs 'path'" in refusal(TokenizerSpec, kind="hf", eos_token="</s>")
    assert "'eos_token'" in refusal(TokenizerSpec, kind="hf", path="tokenizer.json")
    assert "needs 'name'" in refusal(TokenizerSpec, kind="tiktoken")
    assert TokenizerSpec(kind="hf", path="t.json", eos_token="</s>").path == "t.json"
    for size in (259, (1 << 20) + 1):
        refusal(TokenizerSpec, vocab_size=size)


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


# --- sources -----------------------------------------------------------------------------------------------------


def test_a_source_names_its_text_one_way_and_splits_on_something() -> None:
    assert "either 'template' or 'messages'" in refusal(SourceSpec, uri="x", template="{a}", messages="m")
    assert "separator is empty" in refusal(SourceSpec, uri="x", separator="")
    for fields in ({"encoding": "latin-1"}, {"errors": "replace"}):
        assert "parquet strings are UTF-8" in refusal(SourceSpec, uri="x", format="parquet", **fields)
    assert SourceSpec(uri="x", format="parquet", encoding="UTF8").encoding == "UTF8"  # UTF-8, spelled otherwise


TEXT_CODECS = ["utf-8", "utf-8-sig", "latin-1", "cp1252", "ascii", "iso8859_15", "cp437", "koi8_r", "shift_jis", "gbk"]
NOT_ASCII = ["utf-16", "utf-16-le", "utf-32", "cp037", "cp500", "punycode"]


@pytest.mark.parametrize("encoding", TEXT_CODECS)
def test_an_ascii_compatible_encoding_cuts_records_at_newline_bytes(encoding: str) -> None:
    assert SourceSpec(uri="x", encoding=encoding).encoding == encoding
    assert b"\n".decode(encoding) == "\n" and b'{"a": "b"}\r\n'.decode(encoding) == '{"a": "b"}\r\n'


@pytest.mark.parametrize("encoding", NOT_ASCII)
def test_an_encoding_that_would_cut_records_wrongly_is_refused(encoding: str) -> None:
    assert "not ASCII-compatible" in refusal(SourceSpec, uri="x", encoding=encoding)


@pytest.mark.parametrize("encoding", ["rot13", "base64", "hex", "zlib"])
def test_a_codec_that_is_not_a_text_encoding_is_refused_in_one_line(encoding: str) -> None:
    codecs.lookup(encoding)  # a codec Python knows
    mix = f"""\
name: m
sequence: {{length: 64, global_batch: 2}}
sources:
  a: {{uri: "x/*.txt", encoding: {encoding}}}
curriculum:
  - {{phase: one, steps: 2, mixture: {{a: 1}}}}
"""
    with pytest.raises(MixError, match=r"^m\.yaml:4: sources\.a\.encoding: "):
        parse_mix(mix, "m.yaml")


TEMPLATE_TEXT = st.text(st.sampled_from(list("{}[]!:.<>^=+-_#0123456789abrsfx ")), max_size=16)


@given(TEMPLATE_TEXT)
def test_an_accepted_template_names_fields_and_indexes_only(template: str) -> None:
    try:
        spec = SourceSpec(uri="x", template=template)
    except ValidationError as e:
        (err,) = e.errors()
        assert "\n" not in err["msg"]
        return
    assert spec.template == template
    for _lit, name, fmt, conversion in string.Formatter().parse(template):
        if name is None:
            continue
        root = name.split("[", 1)[0]
        assert root and not root.isdigit() and conversion is None
        assert re.fullmatch(r"(\[[^\]]+\])*", name[len(root) :]) and "." not in root  # indexes, no attributes
        assert "{" not in (fmt or "")  # no nested field
        for value in (1.5, 1, "x"):  # whatever the value, a field's text is short (width, precision ≤ 999)
            try:
                shown = format(value, fmt or "")
            except (ValueError, TypeError):
                continue
            assert len(shown) <= 1010


FINGERPRINTED: dict[str, Any] = {
    "format": "jsonl",
    "field": "body",
    "template": "{a}",
    "messages": "chat",
    "chat_template": "plain",
    "separator": "\n\n",
    "metadata": ("tag",),
    "extensions": (".py",),
    "max_record_bytes": 1000,
    "batch_rows": 16,
    "encoding": "latin-1",
    "errors": "replace",
}


@pytest.mark.parametrize("field", sorted(FINGERPRINTED))
def test_the_render_fingerprint_moves_with_every_field_that_decides_documents(field: str) -> None:
    base = SourceSpec(uri="data/*.jsonl")
    changed = SourceSpec(uri="data/*.jsonl", **{field: FINGERPRINTED[field]})
    assert changed.render_fingerprint() != base.render_fingerprint()
    moved = SourceSpec(uri="s3://elsewhere/*.jsonl", max_epochs=2.5, **{field: FINGERPRINTED[field]})
    assert moved.render_fingerprint() == changed.render_fingerprint()  # where the files are and how often: not


def test_every_field_but_uri_and_max_epochs_is_fingerprinted() -> None:
    assert set(SourceSpec.model_fields) - {"uri", "max_epochs"} == set(FINGERPRINTED)


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
