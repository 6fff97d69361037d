"""Switching a run onto a continuation: which loader states saved on an earlier build resume on this one.

A continuation (``weir build NEW --continue BASE --at N``) hands out BASE's build steps before N byte for
byte, and records the switch in its manifest's ``lineage``. A loader state saved on BASE at training step
``s`` resumes on the continuation when the training steps before ``s`` are the same on both: always for
``s ≤ N`` without regrouping (``window`` 1: training steps are build steps). With regrouping (``window`` > 1)
a phase's template is made from the whole phase, so the phase holding N regroups differently on the two
builds: the limit is then that phase's first step, unless N starts a phase of both. A chain of continuations
takes the least limit of its switches from BASE on. Refinement across phase edges (``edges`` > 0) looks
ahead into the next phase, so such a state switches at step 0 only.
"""

from __future__ import annotations

from contract.manifest import Manifest
from contract.record import Lineage, PhaseSpan

__all__ = ["switch_limit"]


def _starts(phases: tuple[PhaseSpan, ...]) -> list[int]:
    return [p.first_step for p in phases]


def _limit(entry: Lineage, phases: tuple[PhaseSpan, ...], window: int, edges: int) -> int:
    """The last step at which a state on ``entry``'s base may switch past ``entry``."""
    if edges > 0:
        return 0
    if window <= 1:
        return entry.at
    if entry.at in _starts(entry.base_phases) and entry.at in _starts(phases):
        return entry.at
    return max([s for s in _starts(entry.base_phases) if s <= entry.at], default=0)


def switch_limit(manifest: Manifest, build_id: str, window: int = 1, edges: int = 0) -> int | None:
    """The last training step at which a loader state saved on the build ``build_id`` (under ``window`` and
    ``edges``) resumes on the build of ``manifest``: None when that build is not in its lineage."""
    entries = manifest.lineage
    for k in range(len(entries) - 1, -1, -1):
        if entries[k].base == build_id:
            phases = manifest.phases or ()
            return min(_limit(e, phases, window, edges) for e in entries[k:])
    return None
