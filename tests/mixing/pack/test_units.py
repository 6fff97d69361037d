"""``mixing/pack/units.py``: blocks of whole steps cover the plan once, each step's units come out grouped and in
the packer's order whatever order they were read in, and a unit at a step the plan lacks is named."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mixing.pack.units import by_step, rows_of, step_ranges


@given(st.lists(st.integers(0, 50), min_size=1, max_size=40), st.integers(1, 120))
def test_step_ranges_cover_every_step_once_in_blocks_of_about_the_size_asked(counts: list[int], chunk: int) -> None:
    steps = np.arange(len(counts), dtype=np.int64) * 3  # any increasing steps
    ranges = step_ranges(steps, np.array(counts, np.int64), chunk)
    covered = [s for lo, hi, _ in ranges for s in steps[(steps >= lo) & (steps <= hi)].tolist()]
    assert covered == steps.tolist()
    assert [n for *_, n in ranges] == [
        sum(c for s, c in zip(steps.tolist(), counts, strict=True) if lo <= s <= hi) for lo, hi, _ in ranges
    ]
    assert all(n >= chunk for *_, n in ranges[:-1])  # each block but the last reaches the size asked
    # and no block holds a step more than it needed to get there
    assert all(n - counts[int(np.searchsorted(steps, hi))] < chunk for _, hi, n in ranges)


@given(st.integers(0, 2**32 - 1))
def test_by_step_groups_each_steps_units_in_the_packers_order_whatever_the_read_order(seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps = np.array([0, 1, 2, 5, 7], np.int64)
    n = int(rng.integers(1, 60))
    units = np.column_stack(
        [
            rng.integers(1, 65, n),  # length
            rng.integers(0, 3, n),  # source
            rng.integers(0, 1000, n),  # doc_id
            rng.integers(0, 4, n) * 64,  # start
            rng.choice(steps, n),  # step
            rng.permutation(n),  # ord
        ]
    ).astype(np.int64)
    got = list(by_step([units[rng.permutation(n)]], steps, 64))
    rows = [r for r, _ in got]
    assert rows == sorted(set(rows_of(steps, units[:, 4]).tolist()))  # each step once, in order
    for r, part in got:
        assert (part[:, 4] == steps[r]).all()
        keys = [tuple(u) for u in part[:, [1, 5, 2, 3]].tolist()]
        assert keys == sorted(keys)  # source, ord, doc_id, start
    assert sorted(map(tuple, np.concatenate([p for _, p in got]).tolist())) == sorted(map(tuple, units.tolist()))


def test_a_unit_at_a_step_the_plan_lacks_or_longer_than_s_is_named() -> None:
    steps = np.array([0, 1, 2], np.int64)
    with pytest.raises(ValueError, match="step 7"):
        rows_of(steps, np.array([1, 7], np.int64))
    with pytest.raises(ValueError, match="longer than S=64"):
        list(by_step([np.array([[65, 0, 0, 0, 1, 0]], np.int64)], steps, 64))
