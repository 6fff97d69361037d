"""``contract.record``: the parts a manifest records of a build's plan keep their defaults (``Regroup`` the
mix file's, ``NO_REGROUP`` one step per window), round-trip through JSON unchanged (a continuation's
``Lineage`` with its phases and feedback), and refuse a base that is not a sha256, a switch at step 0 or a
count below zero. (Read inside a whole manifest: tests/contract/test_manifest.py, test_shards.py.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from contract.record import NO_REGROUP, FeedbackNote, Lineage, PackingNote, PhaseSpan, Regroup, SourceCounts

A = "a" * 64
PHASES = (PhaseSpan(phase="warm", first_step=0, steps=4), PhaseSpan(phase="main", first_step=4, steps=8))


def test_regroup_defaults_and_no_regroup() -> None:
    assert (Regroup().window, Regroup().period, Regroup().slack) == (20, 10, 1.15)
    assert (NO_REGROUP.window, NO_REGROUP.period, NO_REGROUP.slack) == (1, 0, 1.15)


def test_a_lineage_round_trips_through_json() -> None:
    note = FeedbackNote(
        policy="inverse_loss",
        losses_sha256="b" * 64,
        steps=(2, 8),
        loss={"notes": 2.5, "qa": 1.5},
        factor={"notes": 1.2, "qa": 0.8},
        weights={"main": {"notes": 0.6, "qa": 0.4}},
    )
    lineage = Lineage(base=A, at=8, base_mix="mix", base_phases=PHASES, base_url="s3://b/p", feedback=note)
    assert Lineage.model_validate_json(lineage.model_dump_json()) == lineage
    assert Lineage(base=A, at=1).model_dump(exclude_unset=True) == {"base": A, "at": 1}


def test_source_counts_may_lack_documents_dropped() -> None:
    counts = SourceCounts.model_validate_json(
        '{"tokens_planned": 10, "tokens_packed": 8, "tokens_dropped": 2, "documents_packed": 3}'
    )
    assert counts.documents_dropped is None
    assert PackingNote(algorithm="best fit").algorithm == "best fit"


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (Lineage, {"base": "A" * 64, "at": 8}),
        (Lineage, {"base": A[:-1], "at": 8}),
        (Lineage, {"base": A, "at": 0}),
        (PhaseSpan, {"phase": "main", "first_step": -1, "steps": 4}),
        (Regroup, {"window": 0}),
        (FeedbackNote, {"policy": "p", "losses_sha256": A, "steps": [1], "loss": {}, "factor": {}, "weights": {}}),
    ],
)
def test_a_malformed_part_is_refused(cls: type[Any], fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        cls.model_validate_json(json.dumps(fields))  # as a reader reads it: JSON arrays are tuples


def test_a_slack_that_is_not_finite_is_refused() -> None:
    for slack in (float("nan"), float("inf")):
        with pytest.raises(ValidationError):
            Regroup(slack=slack)
