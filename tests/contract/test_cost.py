"""The one cost model: a document of l tokens costs attention·l² + linear·l, per document, per sequence."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from contract.cost import CostModel
from mixing.mixfile.parts import Cost


def test_of_works_on_scalars_and_int_arrays() -> None:
    c = CostModel(2.0, 3.0)
    assert c.of(5) == 2.0 * 25 + 3.0 * 5 and isinstance(c.of(5), float)
    out = c.of(np.array([1, 2, 7], dtype=np.int64))
    assert out.dtype == np.float64 and out.tolist() == [5.0, 14.0, 119.0]
    assert CostModel().of(np.zeros(0, np.int64)).shape == (0,)


@pytest.mark.parametrize("weights", [(1.0, 0.0), (1.0, 8192.0), (0.37, 1.3)])
def test_a_sequences_cost_is_exact_and_what_the_planner_once_summed(weights: tuple[float, float]) -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 32768, 500)
    offs = np.concatenate([[0], np.cumsum(rng.integers(0, 6, 120))])
    offs = offs[offs <= len(lengths)]
    c = CostModel(*weights)
    got = c.sequences(offs, lengths)
    # the loader's planner used to recompute each sequence's cost in a loop, in floats: the same numbers
    for i in range(len(offs) - 1):
        ls = lengths[offs[i] : offs[i + 1]].astype(np.float64)
        assert got[i] == weights[0] * (ls * ls).sum() + weights[1] * ls.sum()
        assert got[i] == c.sequence(lengths[offs[i] : offs[i + 1]][::-1])  # the order of documents does not matter
    assert c.sequence([]) == 0.0


def test_the_mix_files_cost_is_the_model_and_bad_weights_are_refused() -> None:
    assert Cost().model() == CostModel(1.0, 8192.0) and Cost(attention=2, linear=0).model() == CostModel(2.0)
    for bad in ((-1.0, 0.0), (float("nan"), 0.0), ("1", 0.0)):
        with pytest.raises(ValidationError):
            CostModel(*bad)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        CostModel().attention = 2.0  # type: ignore[misc]  # frozen
