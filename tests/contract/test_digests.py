"""``contract/digests.py``: every build records a digest per step that its shards recompute to, and a change
of one token or one document boundary changes that step's digest and no other."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from contract.digests import (
    compute_step_digests,
    first_difference,
    read_step_digests,
    sequence_digests,
    step_digests,
)
from contract.manifest import ShardError
from contract.shards import ShardSet


def test_recorded_digests_are_what_the_shards_hold(tiny_build: Path) -> None:
    shards = ShardSet(tiny_build / "shards")
    recorded = read_step_digests(shards)
    assert recorded is not None and recorded.shape == (shards.manifest.steps, 16)
    assert np.array_equal(recorded, compute_step_digests(shards))
    assert len({bytes(r) for r in recorded}) == len(recorded)  # tiny steps all differ


def test_one_token_or_one_boundary_changes_one_step() -> None:
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 500, (6, 16)).astype(np.uint16)
    off, lengths = np.array([0, 2, 3, 5, 6, 8, 9]), np.array([5, 11, 16, 10, 6, 8, 8, 4, 12])
    steps = np.array([0, 0, 1, 1, 2, 2])  # sequence 4 holds 8 + 4 real tokens, then 4 padding slots
    base = step_digests(steps, sequence_digests(tokens, off, lengths), 3)
    assert np.array_equal(base, step_digests(steps, sequence_digests(tokens.astype(np.uint32), off, lengths), 3))
    edited = tokens.copy()
    edited[3, 2] += 1  # a real token of step 1
    assert first_difference(base, step_digests(steps, sequence_digests(edited, off, lengths), 3)) == 1
    moved = lengths.copy()
    moved[[6, 7]] = [7, 5]  # a boundary inside sequence 4 (step 2), the same tokens
    assert first_difference(base, step_digests(steps, sequence_digests(tokens, off, moved), 3)) == 2
    padding = tokens.copy()
    padding[4, 15] += 1  # a padding slot: not what the trainer learns from
    assert first_difference(base, step_digests(steps, sequence_digests(padding, off, lengths), 3)) is None
    assert first_difference(base, base[:2]) == 2


def test_a_damaged_digest_file_is_refused(tiny_build: Path, tmp_path: Path) -> None:
    copy = tmp_path / "b"
    shutil.copytree(tiny_build, copy)
    shards = ShardSet(copy / "shards")
    entry = shards.manifest.step_digests
    assert entry is not None
    path = copy / "shards" / entry.name
    data = bytearray(path.read_bytes())
    data[3] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=r"differs from manifest\.json"):
        read_step_digests(shards)
