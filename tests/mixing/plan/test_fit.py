"""``mixing/plan/fit.py``: what the probe names is deferred past its phase and held, a source's last phase only
held; the plan is drawn again until the probe names nothing, at most FIT_ROUNDS times."""

from __future__ import annotations

from pathlib import Path

from mixing.plan.curriculum import Held
from mixing.plan.fit import FIT_ROUNDS, Deferred, Left, fit

FINAL = {"a": "anneal", "b": "anneal"}


def test_what_a_phase_leaves_is_deferred_and_held_and_a_last_phase_only_held(tmp_path: Path) -> None:
    answers = [[Left("a", 7, "main", 9, 40), Left("b", 3, "anneal", 19, 25)], [Left("a", 11, "main", 9, 5)], []]
    drawn: list[tuple[dict[tuple[str, str], int], dict[str, dict[int, int]]]] = []

    def draw(held: Held, deferred: Deferred) -> int:
        drawn.append((dict(held), {s: dict(d) for s, d in deferred.items()}))
        return len(drawn)

    first, last = fit(draw, lambda _db: answers.pop(0), tmp_path / "weir.duckdb", FINAL)
    assert (first, last) == (1, 3) and answers == []
    assert drawn[0] == ({}, {})
    assert drawn[1] == ({("main", "a"): 40, ("anneal", "b"): 25}, {"a": {7: 9}})  # b's last phase: held only
    assert drawn[2] == ({("main", "a"): 45, ("anneal", "b"): 25}, {"a": {7: 9, 11: 9}})


def test_at_most_fit_rounds_plans_are_drawn(tmp_path: Path) -> None:
    count: list[int] = []

    def draw(_held: Held, _deferred: Deferred) -> int:
        count.append(1)
        return len(count)

    first, last = fit(
        draw,
        lambda _db: [Left("a", len(count), "main", 9, 1)],
        tmp_path / "weir.duckdb",
        FINAL,
    )
    assert len(count) == FIT_ROUNDS and (first, last) == (1, FIT_ROUNDS)
