"""``loaders/switch.py``: the last step at which a loader state saved on a base build switches onto a build that
continues it, for each way the training steps can depend on steps past the switch. (The switch itself, through
``PackedDataset.load_state_dict`` on real continuations: ``tests/mixing/test_continuation.py``.)"""

from __future__ import annotations

from pathlib import Path

from contract.record import Lineage, PhaseSpan
from contract.shards import ShardSet
from loaders.switch import switch_limit

A, B = "a" * 64, "b" * 64
BASE_PHASES = (PhaseSpan(phase="warm", first_step=0, steps=4), PhaseSpan(phase="main", first_step=4, steps=8))


def _manifest(tiny_build: Path, *lineage: Lineage, phases: tuple[PhaseSpan, ...] = BASE_PHASES):  # type: ignore[no-untyped-def]
    m = ShardSet(tiny_build / "shards").manifest
    return m.model_copy(update={"lineage": lineage, "phases": phases})


def test_a_build_outside_the_lineage_does_not_switch(tiny_build: Path) -> None:
    m = _manifest(tiny_build, Lineage(base=A, at=8, base_phases=BASE_PHASES))
    assert switch_limit(m, B) is None
    assert switch_limit(_manifest(tiny_build), A) is None


def test_the_limit_follows_the_regrouping(tiny_build: Path) -> None:
    mid = Lineage(base=A, at=8, base_phases=BASE_PHASES)  # 8 is inside the base's phase 'main' (4..11)
    m = _manifest(tiny_build, mid)
    assert switch_limit(m, A, window=1) == 8  # training steps are build steps
    assert switch_limit(m, A, window=4) == 4  # the phase holding the switch regroups differently: its start
    assert switch_limit(m, A, window=4, edges=1) == 0  # refinement looks into the next phase
    at_phase = Lineage(base=A, at=4, base_phases=BASE_PHASES)  # a phase starts at 4 in both builds
    assert switch_limit(_manifest(tiny_build, at_phase), A, window=4) == 4


def test_a_chain_takes_its_least_limit(tiny_build: Path) -> None:
    first = Lineage(base=A, at=8, base_phases=BASE_PHASES)
    second = Lineage(base=B, at=6, base_phases=BASE_PHASES)
    m = _manifest(tiny_build, first, second)
    assert switch_limit(m, A) == 6 and switch_limit(m, B) == 6
    later = Lineage(base=B, at=10, base_phases=BASE_PHASES)
    assert switch_limit(_manifest(tiny_build, first, later), A) == 8
