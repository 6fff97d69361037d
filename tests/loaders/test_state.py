"""loaders.state: the resumable position's dict form, its version, and what a resume may change."""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from loaders.state import STATE_VERSION, LoaderState, StateError

# The fields of version 3. A change to LoaderState's fields fails here: raise STATE_VERSION, say in
# loaders/state.py how a state of the version before loads (or that it is refused), and update this line.
FIELDS = (
    "build_id seed window step consumed dp_rank dp_size cp_size version period micro_batches slack context layout edges"
)


def state(**kw: object) -> LoaderState:
    base: dict[str, object] = dict(build_id="b" * 64, seed=1, window=4, step=7, consumed=0, dp_rank=0, dp_size=2)
    return LoaderState(**(base | {"cp_size": 1} | kw))  # type: ignore[arg-type]


def test_the_fields_are_those_of_the_version() -> None:
    assert STATE_VERSION == 3
    assert " ".join(f.name for f in dataclasses.fields(LoaderState)) == FIELDS


def test_a_state_survives_json() -> None:
    s = state(period=8, slack=0.02, context=[[1, 2], [3, 4]], layout=1, edges=2, micro_batches="unequal")
    assert LoaderState.from_dict(json.loads(json.dumps(s.to_dict()))) == s


def test_a_version_2_state_loads_with_what_that_loader_did() -> None:
    old = {k: v for k, v in state().to_dict().items() if k not in ("period", "slack", "context", "layout", "edges")}
    loaded = LoaderState.from_dict(old | {"version": 2, "micro_batches": "equal"})
    assert loaded == state()  # absent fields: no regrouping template, no refinement, the first layout, no edges
    assert loaded.version == STATE_VERSION


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d | {"version": 1}, "version 1; this loader reads versions 2, 3"),
        (lambda d: d | {"version": 4}, "version 4"),
        (lambda d: [d], "version 'list'"),
        (lambda d: {k: v for k, v in d.items() if k != "edges"}, "version 3 lacks field 'edges'"),
        (lambda d: {k: v for k, v in d.items() if k != "seed"} | {"version": 2}, "lacks field 'seed'"),
        (lambda d: d | {"shuffle": True}, "fields this loader does not know: ['shuffle']"),
    ],
)
def test_a_state_it_cannot_read_is_one_line(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(StateError, match=message.replace("[", r"\[").replace("]", r"\]")) as e:
        LoaderState.from_dict(mutate(state().to_dict()))
    assert "\n" not in str(e.value)


def test_check_names_what_differs() -> None:
    here = state()
    state(step=3).check(here)  # another step of the same steps: fine
    state(dp_size=4, cp_size=2).check(here)  # at a step boundary, any world
    with pytest.raises(StateError, match="another build"):
        state(build_id="c" * 64).check(here)
    with pytest.raises(StateError, match="edges 2"):
        state(edges=2).check(here)
    with pytest.raises(StateError, match="step boundary"):
        state(consumed=1, dp_size=4).check(here)
    state(consumed=1, cp_size=2).check(here)  # inside a step, another cp_size is fine


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("consumed", -3, "'consumed' is -3; expected a whole number ≥ 0"),
        ("step", -1, "'step' is -1"),
        ("step", "7", "'step' is '7'"),
        ("step", 7.0, "'step' is 7.0"),
        ("step", None, "'step' is None"),
        ("dp_size", 0, "'dp_size' is 0"),
        ("dp_rank", 2, "'dp_rank' is 2; expected < dp_size 2"),
        ("window", True, "'window' is True"),
        ("build_id", "b" * 12, "'build_id' is 'bbbbbbbbbbbb'"),
        ("micro_batches", "some", "'micro_batches' is 'some'"),
        ("slack", float("nan"), "'slack' is nan"),
        ("slack", -1.0, "'slack' is -1.0"),
        ("context", [[1, 2], [3]], "'context' is not a list of equal rows"),
        ("context", [[1, -2]], "'context' is not"),
        ("context", "[[1]]", "'context' is not"),
    ],
)
def test_a_hand_edited_field_is_refused_in_one_line(field: str, value: object, message: str) -> None:
    with pytest.raises(StateError, match=re.escape(message)) as e:
        LoaderState.from_dict(state().to_dict() | {field: value})
    assert "\n" not in str(e.value)


def test_numpy_integers_are_whole_numbers() -> None:
    assert state(step=np.int64(3), consumed=np.int32(1)).step == 3
