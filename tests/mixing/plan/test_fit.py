"""``mixing/plan/fit.py``: what the probe names is deferred past its phase and held, a source's last phase only
held; the plan is drawn again until the probe names nothing, at most FIT_ROUNDS times."""

from __future__ import annotations

from pathlib import Path

from mixing.plan.curriculum import Held
from mixing.plan.fit import FIT_ROUNDS, Deferred, Left, fit, still_left

FINAL = {"a": "anneal", "b": "anneal"}


def test_what_a_phase_leaves_is_deferred_and_held_and_a_last_phase_only_held(tmp_path: Path) -> None:
    answers = [
        [Left("a", 7, 4, "main", 9, 40), Left("b", 3, 15, "anneal", 19, 25)],
        [Left("a", 11, 4, "main", 9, 5)],
        [],
    ]
    drawn: list[tuple[dict[tuple[int, str], int], dict[str, dict[int, int]]]] = []

    def draw(held: Held, deferred: Deferred) -> int:
        drawn.append((dict(held), {s: dict(d) for s, d in deferred.items()}))
        return len(drawn)

    first, last, deferred, left = fit(draw, lambda _db: answers.pop(0), tmp_path / "weir.duckdb", FINAL)
    assert (first, last, left) == (1, 3, []) and answers == [] and deferred == {"a": {7: 9, 11: 9}}
    assert drawn[0] == ({}, {})
    # held at the step that drew each unit; deferred past its phase's last step, but in b's last phase
    assert drawn[1] == ({(4, "a"): 40, (15, "b"): 25}, {"a": {7: 9}})
    assert drawn[2] == ({(4, "a"): 45, (15, "b"): 25}, {"a": {7: 9, 11: 9}})


def test_at_most_fit_rounds_plans_are_drawn(tmp_path: Path) -> None:
    count: list[int] = []

    def draw(_held: Held, _deferred: Deferred) -> int:
        count.append(1)
        return len(count)

    first, last, _, left = fit(
        draw,
        lambda _db: [Left("a", len(count), 4, "main", 9, 1)],
        tmp_path / "weir.duckdb",
        FINAL,
    )
    assert len(count) == FIT_ROUNDS and (first, last) == (1, FIT_ROUNDS)
    assert left == [Left("a", FIT_ROUNDS, 4, "main", 9, 1)], "what the last plan's packing still leaves"
    assert still_left(left) == (
        f"the plan's fit stopped after {FIT_ROUNDS} plans with 1 document(s) still dropped whole at phase ends "
        "(1 tokens; 'a' 1)",
    )
    assert still_left([]) == ()
