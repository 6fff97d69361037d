"""Fitting a plan to its packing: the plan drawn again until its packing drops no document whole.

A phase's packing leaves gaps, so a plan that draws exactly a phase's tokens has more than its sequences hold
and the phase end drops the surplus; where no piece of a long document can stand in, whole documents. The
plan stage's ``probe`` (:func:`mixing.pack.whole_drops.whole_drops`) packs the plan as the build will and names
the units starting a document that a phase end drops (:class:`Left`); :func:`fit` draws the plan again with
each deferred past its phase and the step that drew it drawing that many tokens fewer. Deterministic: the draw
and the packing are.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NamedTuple, TypeVar

import duckdb
import pyarrow as pa

from mixing.plan.curriculum import Held

__all__ = ["FIT_ROUNDS", "Deferred", "Left", "Probe", "fit", "not_drawn_again", "still_left"]


class Left(NamedTuple):
    """A unit a phase's packing leaves at its end: its ``source``, its ``ord`` in the source's draw, the ``step``
    that drew it, ``phase`` and that phase's last step ``last``, its ``length`` in tokens."""

    source: str
    ord: int
    step: int
    phase: str
    last: int
    length: int


Probe = Callable[[Path], list[Left]]  # the build's DuckDB file → what the packing of the plan written there leaves
Deferred = Mapping[str, Mapping[int, int]]  # source → ord → the step the unit must be drawn after
FIT_ROUNDS = 8  # plans drawn at most, each deferring what the packing of the one before left

P = TypeVar("P")


def fit(
    draw: Callable[[Held, Deferred], P], probe: Probe, db: Path, final: Mapping[str, str]
) -> tuple[P, P, Deferred, list[Left]]:
    """The plan as first drawn, as fitted, the units it deferred (per source, as ``draw`` took them) and what the
    fitted plan's packing still leaves (empty unless :data:`FIT_ROUNDS` plans were drawn and the last was not
    settled): ``draw(held, deferred)`` writes a plan into ``db`` (``held``: (step, source) → tokens that step draws
    fewer of; ``deferred``: as :func:`mixing.plan.draws.draw_source` takes it, per source) and returns it; after
    each, ``probe(db)`` names the units its packing leaves, each then deferred past its phase and held at the step
    that drew it, until it names none or :data:`FIT_ROUNDS` plans were drawn. In a source's last phase
    (``final``: source → phase) a unit is held, not deferred: there is no later phase, and what waits is the end
    of the source's draw. The phase's other units keep their steps, so it packs almost as it did; the later
    phases are packed anew and probed in turn."""
    held: dict[tuple[int, str], int] = {}
    deferred: dict[str, dict[int, int]] = {}
    first = plan = draw(held, deferred)
    for _ in range(FIT_ROUNDS - 1):
        left = probe(db)
        if not left:
            return first, plan, deferred, []
        for unit in left:
            if unit.phase != final[unit.source]:
                deferred.setdefault(unit.source, {})[unit.ord] = unit.last
            held[unit.step, unit.source] = held.get((unit.step, unit.source), 0) + unit.length
        plan = draw(held, deferred)
    return first, plan, deferred, probe(db)  # the rounds ran out: what the last plan's packing still leaves


def still_left(left: list[Left]) -> tuple[str, ...]:
    """The sentence saying what a plan the fit did not settle still drops whole at phase ends, if anything."""
    if not left:
        return ()
    sources = ", ".join(f"{s!r} {n}" for s, n in sorted(Counter(u.source for u in left).items()))
    return (
        f"the plan's fit stopped after {FIT_ROUNDS} plans with {len(left)} document(s) still dropped whole at "
        f"phase ends ({sum(u.length for u in left)} tokens; {sources})",
    )


def not_drawn_again(
    db_path: Path, deferred: Deferred, config: Mapping[str, str | int | bool] | None
) -> tuple[str, ...]:
    """One sentence per source with units the fit deferred past their phase that the plan does not draw again:
    no later phase draws the source within their length (a later ``max_doc_tokens`` shorter than they are)."""
    pairs = [(s, o) for s, ords in deferred.items() for o in ords]
    if not pairs:
        return ()
    with duckdb.connect(str(db_path), read_only=True, config=dict(config or {})) as con:
        con.register("deferred_in", pa.table({"source": [s for s, _ in pairs], "ord": [o for _, o in pairs]}))
        lost = con.sql(
            "SELECT d.source, count(*) FROM deferred_in d ANTI JOIN plan_units u ON u.source = d.source "
            "AND u.ord = d.ord GROUP BY 1 ORDER BY 1"
        ).fetchall()
    return tuple(
        f"source {s!r}: {n} document(s) a phase end leaves are not planned again "
        "(no later phase draws the source within their length)"
        for s, n in lost
    )
