"""``assign_ranks`` (heap LPT, swap table kept in place) gives exactly the results of its first version."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.balance import assign_ranks


def reference(costs: np.ndarray, dp_size: int, max_swap_rounds: int = 64) -> np.ndarray:
    """The first version of ``assign_ranks`` (numpy scan per sequence, swap table rebuilt every round)."""
    costs = np.asarray(costs, dtype=np.float64)
    n = len(costs)
    per = n // dp_size
    ranks = np.empty(n, dtype=np.int64)
    if per == 1:
        ranks[np.argsort(-costs, kind="stable")] = np.arange(n)
        return ranks
    loads = np.zeros(dp_size)
    counts = np.zeros(dp_size, dtype=np.int64)
    for i in np.argsort(-costs, kind="stable"):
        open_ = np.flatnonzero(counts < per)
        r = int(open_[np.argmin(loads[open_])])
        ranks[i] = r
        loads[r] += costs[i]
        counts[r] += 1
    members = [np.flatnonzero(ranks == r).tolist() for r in range(dp_size)]
    for _ in range(max_swap_rounds):
        hi = int(np.argmax(loads))
        table = np.array(members)
        mine = costs[table[hi]]
        d = mine[None, :, None] - costs[table][:, None, :]
        new_max = np.maximum(loads[hi] - d, loads[:, None, None] + d)
        gain = loads[hi] - new_max
        gain[hi] = -np.inf
        r, a, b = (int(x) for x in np.unravel_index(int(np.argmax(gain)), gain.shape))
        if gain[r, a, b] <= 1e-9 * loads[hi]:
            break
        i, j = int(table[hi, a]), int(table[r, b])
        members[hi][a], members[r][b] = j, i
        ranks[i], ranks[j] = r, hi
        loads[hi] -= d[r, a, b]
        loads[r] += d[r, a, b]
    return ranks


@settings(max_examples=200)
@given(st.integers(1, 16), st.integers(1, 8), st.sampled_from(["pareto", "ties", "equal"]), st.integers(0, 2**32 - 1))
def test_assign_ranks_equals_its_first_version(dp: int, per: int, kind: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = dp * per
    costs = {
        "pareto": rng.pareto(1.0, n) + 1,
        "ties": rng.integers(1, 4, n).astype(np.float64),  # many equal costs and equal loads: tie breaking
        "equal": np.ones(n),
    }[kind]
    assert np.array_equal(assign_ranks(costs, dp), reference(costs, dp))


@pytest.mark.parametrize(("n", "dp"), [(1024, 128), (1024, 8), (64, 8)])
def test_assign_ranks_equals_its_first_version_at_scale(n: int, dp: int) -> None:
    rng = np.random.default_rng(n + dp)
    for costs in (rng.pareto(1.0, n) + 1, np.sort(rng.pareto(1.0, n) + 1), rng.integers(1, 3, n) * 1.0):
        assert np.array_equal(assign_ranks(costs, dp), reference(costs, dp))
