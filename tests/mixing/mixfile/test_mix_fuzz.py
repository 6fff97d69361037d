"""Fuzzing the mix file: a valid mix with random YAML values put into its fields, keys repeated or lines
dropped either validates into a buildable mix or fails with one ``FILE:LINE: field: problem`` line; never
anything else (a traceback in ``weir validate``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from mixing import MixError
from mixing.mixfile.mix import parse_mix
from mixing.mixfile.parts import MAX_STEPS, MAX_TOKENS_PER_STEP

ROOT = Path(__file__).resolve().parents[3]
BASE = yaml.safe_load((ROOT / "mixes" / "demo.yaml").read_text())
ONE_LINE = re.compile(r"^bad\.yaml:\d+: \S.*$")

# YAML scalars as a user might mistype them, and values chosen to hit limits.
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, -1, 1, 2**31, 2**63, 10**13, 10**400]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(["", "15%", "100%", "-5%", "50M", "1.5B", "1e9", "0", "{env_HOME}", "nan", "1" * 300 + "T"]),
    st.text(max_size=20),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for k, v in node.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += _paths(v, (*prefix, i))
    return out


PATHS = _paths(BASE)[1:]


def _put(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    import copy

    doc = copy.deepcopy(doc)
    node = doc
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return doc


@st.composite
def mutated_mix(draw: st.DrawFn) -> str:
    doc = BASE
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        try:
            doc = _put(doc, path, draw(VALUES))
        except (KeyError, IndexError, TypeError):  # an earlier substitution removed the path
            continue
    text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    lines = text.splitlines()
    edit = draw(st.sampled_from(["none", "repeat", "drop"]))
    if lines and edit != "none":
        i = draw(st.integers(0, len(lines) - 1))
        lines = lines[: i + 1] + lines[i:] if edit == "repeat" else lines[:i] + lines[i + 1 :]
    return "\n".join(lines) + "\n"


@settings(max_examples=400)
@given(mutated_mix())
def test_a_mutated_mix_validates_or_fails_with_one_line(text: str) -> None:
    try:
        mix = parse_mix(text, "bad.yaml")
    except MixError as e:
        assert ONE_LINE.match(str(e)), repr(str(e))
        return
    # A mix that validates can be planned: within the limits that keep a build out of MemoryError.
    assert 0 < mix.total_steps <= MAX_STEPS
    assert mix.sequence.length * mix.sequence.global_batch <= MAX_TOKENS_PER_STEP
    assert all(w == w and w != float("inf") for ph in mix.curriculum for w in ph.mixture.values())


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (("steps: 8,", "steps: 10000000000000,"), "curriculum[0].steps: 10,000,000,000,000 steps"),
        (("seed: 1234", "seed: 1234\nseed: 99"), "seed: duplicate key 'seed'"),
        (
            ("{prose: 0.7, code: 0.2, qa: 0.1}", "{prose: .nan, code: 0.2, qa: 0.1}"),
            "mixture.prose: nan is not a finite",
        ),
    ],
)
def test_weir_validate_prints_one_line_and_exits_2(tmp_path: Path, edit: tuple[str, str], words: str) -> None:
    text = (ROOT / "mixes" / "demo.yaml").read_text()
    assert edit[0] in text, "the edit does not apply to the demo mix any more"
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(*edit, 1))
    r = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "validate", str(bad)], cwd=ROOT, capture_output=True, text=True
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{bad}:" in lines[0] and words in lines[0], r.stderr
