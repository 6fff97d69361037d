"""mixing/mixfile/locations.py: where in a mix file a problem is, on one line. A field path reads as written in
the docs and stays on one line whatever its keys hold; a field's line is its key's (a list item's: its own), the
same whether recorded for the whole document or found for one path, and a missing field's is its parent's; a key
given twice is refused at its second line, an alias checked once; pydantic's errors become one ``FILE:LINE:
FIELD: problem`` line, a cross-field error at its own path.

(Every message of a whole mix file: test_mix.py and test_mix_fuzz.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from mixing import MixError, load_mix
from mixing.mixfile.locations import FieldError, dotted, field_lines, line_of, no_duplicate_keys, validation_error


def compose(text: str) -> yaml.Node | None:
    return yaml.compose(text, Loader=yaml.SafeLoader)


DOC = """\
name: m
sequence: {length: 128, global_batch: 2}
sources:
  a: &src
    uri: "x/*.txt"
  b: *src
curriculum:
  - phase: one
    steps: 10
    mixture: {a: 0.5, b: 0.5}
  -
    phase: two
    mixture:
      a: 1
"""


@pytest.mark.parametrize(
    ("loc", "shown"),
    [
        ((), "(top level)"),
        (("name",), "name"),
        (("curriculum", 1, "mixture", "math"), "curriculum[1].mixture.math"),
        ((0, "a"), "[0].a"),
        (("seed", " \n"), "seed[' \\n']"),
        (("sources", "my data"), "sources['my data']"),
        (("", "x"), "[''].x"),
    ],
)
def test_a_field_path_reads_as_in_the_docs(loc: tuple[str | int, ...], shown: str) -> None:
    assert dotted(loc) == shown


@given(st.lists(st.one_of(st.text(max_size=6), st.integers(0, 99)), max_size=4))
def test_a_field_path_is_one_line_whatever_its_keys_hold(loc: list[str | int]) -> None:
    shown = dotted(tuple(loc))
    assert shown and shown.isprintable()


def test_every_field_has_its_key_line_and_a_missing_one_its_parent_line() -> None:
    node = compose(DOC)
    lines = field_lines(node)
    assert lines[("name",)] == 1 and lines[("sequence", "length")] == 2
    assert lines[("curriculum", 0)] == 8 and lines[("curriculum", 0, "steps")] == 9
    assert lines[("curriculum", 1)] == 12  # a list item's own line: its first key, after the bare dash
    assert lines[("curriculum", 1, "mixture", "a")] == 14
    assert ("sources", "a", "uri") in lines or ("sources", "b", "uri") in lines  # an alias is walked once
    for loc, line in lines.items():
        assert line_of(node, loc) == line, loc
    assert line_of(node, ("curriculum", 1, "steps")) == 12  # missing: the phase's line
    assert line_of(node, ("curriculum", 5, "steps")) == 7  # no such phase: the list's key line
    assert line_of(node, ("colour",)) == 1 and line_of(None, ("name",)) == 1 and field_lines(None) == {}


def test_a_key_given_twice_is_refused_at_its_second_line() -> None:
    no_duplicate_keys(compose(DOC), (), "m.yaml")  # an alias repeats a mapping, not a key
    with pytest.raises(MixError) as e:
        no_duplicate_keys(compose(DOC.replace("    steps: 10\n", "    steps: 10\n    steps: 11\n")), (), "m.yaml")
    assert str(e.value) == (
        "m.yaml:10: curriculum[0].steps: duplicate key 'steps' (first on line 9); expected each field once"
    )


def test_a_duplicate_key_of_whitespace_is_named_on_one_line(tmp_path: Path) -> None:
    # found by the mutation fuzz: a key " \n" repeated put a newline into the message
    bad = tmp_path / "bad.yaml"
    bad.write_text('name: x\nseed:\n  ? " \\n"\n  ? " \\n"\n')
    with pytest.raises(MixError) as e:
        load_mix(bad)
    assert "\n" not in str(e.value) and "seed[' \\n']: duplicate key" in str(e.value)


class Point(BaseModel):
    """A model to validate: ``x`` within 10 of ``y``, a cross-field check placed at ``x``."""

    model_config = ConfigDict(extra="forbid")
    x: int
    y: int = 0

    @model_validator(mode="after")
    def _close(self) -> Point:
        if self.x > self.y + 10:
            raise FieldError(("x",), "x is far from y; expected them close")
        return self


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("x: 1\nyy: 2\n", "p.yaml:2: yy: unknown field 'yy'; did you mean 'y'?"),  # misspelled, not missing
        ("y: 0\nx: 100\n", "p.yaml:2: x: x is far from y; expected them close."),
        ("y: 1\n", "p.yaml:1: x: field required but missing."),
        (
            "x: lots\ny: [1]\n",
            "p.yaml:1: x: Input should be a valid integer, unable to parse string as an integer. "
            "(1 more problem(s) after fixing this)",
        ),
    ],
)
def test_validation_errors_become_one_line_at_the_field(text: str, message: str) -> None:
    with pytest.raises(ValidationError) as e:
        Point.model_validate(yaml.safe_load(text))
    err = validation_error(Point, e.value, compose(text), "p.yaml")
    assert isinstance(err, MixError) and str(err) == message
