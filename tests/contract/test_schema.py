"""``contract.schema``: a part is strict (a count given as a string or a float is refused), frozen, ignores keys
it does not declare, refuses counts and weights out of range, and reads a recorded null of a ``Defaulted`` field
as its default."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from pydantic import ValidationError

from contract.schema import Defaulted, Frozen, NonNeg, Pos, Weight


class Part(Frozen):
    count: NonNeg = 0
    size: Pos = 1
    weight: Weight = 1.0
    seed: Annotated[NonNeg, Defaulted] = 3


def test_a_part_reads_its_fields_and_ignores_unknown_keys() -> None:
    part = Part.model_validate_json('{"count": 0, "size": 2, "weight": 0.5, "seed": 7, "newer": "field"}')
    assert part == Part(count=0, size=2, weight=0.5, seed=7)
    assert not hasattr(part, "newer")


@pytest.mark.parametrize("field", [{"count": "32"}, {"count": 1.0}, {"size": True}, {"weight": "1.0"}])
def test_a_value_of_the_wrong_type_is_refused(field: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Part.model_validate(field)


@pytest.mark.parametrize(
    "field",
    [{"count": -1}, {"size": 0}, {"weight": -0.5}, {"weight": float("nan")}, {"weight": float("inf")}, {"seed": -1}],
)
def test_a_count_or_weight_out_of_range_is_refused(field: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Part.model_validate(field)


def test_a_part_is_frozen() -> None:
    part = Part()
    with pytest.raises(ValidationError):
        part.count = 5  # type: ignore[misc]
    assert part.count == 0


def test_a_recorded_null_means_the_default_only_where_defaulted() -> None:
    assert Part.model_validate_json('{"seed": null}').seed == 3
    with pytest.raises(ValidationError):
        Part.model_validate_json('{"count": null}')
