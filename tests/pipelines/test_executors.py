"""``pipelines/executors.py``: the executor is configuration. ``WEIR_EXECUTOR`` picks it (default, and blank:
multiprocess), ``WEIR_MAX_CONCURRENT`` caps the multiprocess one's steps, and anything else is refused in one
line naming the value, as a :class:`~contract.errors.WeirError`."""

from __future__ import annotations

import dagster as dg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.errors import WeirError
from pipelines.executors import EXECUTORS, ExecutorChoiceError, executor_from_env


def test_the_executor_is_chosen_by_configuration() -> None:
    assert executor_from_env({}) is dg.multiprocess_executor
    assert executor_from_env({"WEIR_EXECUTOR": "  "}) is dg.multiprocess_executor
    assert executor_from_env({"WEIR_EXECUTOR": "multiprocess", "WEIR_MAX_CONCURRENT": ""}) is dg.multiprocess_executor
    assert executor_from_env({"WEIR_EXECUTOR": " in_process "}) is dg.in_process_executor
    assert {executor_from_env({"WEIR_EXECUTOR": k}).name for k in EXECUTORS} == set(EXECUTORS)


@settings(max_examples=50)
@given(limit=st.integers(min_value=1, max_value=4096))
def test_max_concurrent_caps_the_multiprocess_executor(limit: int) -> None:
    executor = executor_from_env({"WEIR_MAX_CONCURRENT": str(limit)})
    assert executor.name == "multiprocess"
    mapped = executor.apply_config_mapping({}).value
    assert mapped is not None and mapped["config"]["max_concurrent"] == limit


@settings(max_examples=100)
@given(value=st.text(min_size=1, max_size=12).filter(lambda s: not s.isdigit()))
def test_a_limit_that_is_not_a_whole_number_is_refused_in_one_line(value: str) -> None:
    with pytest.raises(ExecutorChoiceError) as e:
        executor_from_env({"WEIR_MAX_CONCURRENT": value})
    assert str(e.value) == f"WEIR_MAX_CONCURRENT={value!r}: expected a whole number of processes"


@settings(max_examples=100)
@given(kind=st.text(st.characters(blacklist_categories=["Cs"]), min_size=1, max_size=12))
def test_an_unknown_executor_is_refused_in_one_line_naming_the_choices(kind: str) -> None:
    if kind.strip() in (*EXECUTORS, ""):
        return
    with pytest.raises(ExecutorChoiceError) as e:
        executor_from_env({"WEIR_EXECUTOR": kind})
    assert isinstance(e.value, WeirError) and isinstance(e.value, ValueError)
    assert str(e.value) == f"WEIR_EXECUTOR={kind.strip()!r}: expected one of multiprocess, in_process"


def test_a_digit_that_is_no_number_is_refused_as_a_choice_error() -> None:
    with pytest.raises(ExecutorChoiceError, match="expected a whole number"):
        executor_from_env({"WEIR_MAX_CONCURRENT": "²"})
