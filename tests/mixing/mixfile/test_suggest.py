"""mixing.mixfile.suggest: the nearest valid field name of a misspelled one, found from the models themselves
at any depth of the mix file (mappings, lists, unions), and the error reported first."""

from __future__ import annotations

import pytest

from mixing.mixfile.mix import Mix
from mixing.mixfile.suggest import first_error, known_fields, unknown_field


@pytest.mark.parametrize(
    ("loc", "field"),
    [
        ((), "sources"),
        (("sources", "web"), "max_epochs"),
        (("curriculum", 0), "mixture"),
        (("curriculum", 0, "transition"), "shape"),
        (("tokenizer",), "eos_token"),
    ],
)
def test_known_fields_follow_the_models_down(loc: tuple[object, ...], field: str) -> None:
    known = known_fields(Mix, loc)
    assert field in known
    assert "path" not in known_fields(Mix, ())  # excluded from the file: never suggested


def test_a_path_into_a_value_knows_no_fields() -> None:
    assert known_fields(Mix, ("name",)) == [] and known_fields(Mix, ("sources", "web", "uri")) == []


def test_the_nearest_name_or_the_valid_ones() -> None:
    assert unknown_field(Mix, ("sources", "a", "max_epoch")) == "unknown field 'max_epoch'; did you mean 'max_epochs'?"
    far = unknown_field(Mix, ("sequence", "zzzzzz"))
    assert far.startswith("unknown field 'zzzzzz'; expected one of: ") and "length" in far and "\n" not in far


def test_a_misspelled_required_field_is_reported_as_misspelled_not_missing() -> None:
    errors = [
        {"type": "missing", "loc": ("name",)},
        {"type": "extra_forbidden", "loc": ("nmae",)},
    ]
    assert first_error(Mix, errors)["loc"] == ("nmae",)
    assert first_error(Mix, errors[:1])["loc"] == ("name",)
