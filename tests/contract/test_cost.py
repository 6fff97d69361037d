"""The one cost model: a document of l tokens costs attention·l² + linear·l, per document, per sequence; split over
d ranks (the hybrid deal), compute + communication per rank, with defaults that leave every older figure as it was."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from contract.cost import FLEXSP_7B, CostModel
from mixing.mixfile.balance import Cost


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


# --- split over d ranks: the hybrid deal's terms --------------------------------------------------------------


def test_a_manifest_without_the_hybrid_fields_means_what_it_meant() -> None:
    from contract.manifest import BuildInfo

    for old in ({"attention": 1.0, "linear": 8192.0}, {"attention": 2.0, "linear": 0.0}):
        info = BuildInfo.model_validate_json(json.dumps({"cost": old}))
        assert info.cost == CostModel(old["attention"], old["linear"])
        assert info.as_json()["cost"] == old  # written back byte for byte: no new keys at their defaults
        l = np.array([1, 100, 8192, 131072])  # noqa: E741
        assert info.cost.of(l).tolist() == (old["attention"] * l * l + old["linear"] * l).tolist()
        assert np.array_equal(info.cost.compute(l, 1), info.cost.of(l))  # per_document 0: compute is the cost
        assert np.array_equal(info.cost.time(l, 1), info.cost.of(l))  # and one rank moves nothing
    assert BuildInfo().as_json() == {} and CostModel().of(3) == 9.0
    given = CostModel(1.0, 0.0, per_document=5.0, intra_bandwidth=(1e9, 2e9))
    info = BuildInfo(cost=given)
    assert info.as_json()["cost"] == {
        "attention": 1.0,
        "linear": 0.0,
        "per_document": 5.0,
        "intra_bandwidth": [1e9, 2e9],
    }
    assert BuildInfo.model_validate_json(json.dumps(info.as_json())).cost == given  # a JSON list reads as the tuple


def test_compute_comm_and_time_of_a_split_document() -> None:
    c = CostModel(2.0, 3.0, per_document=7.0, unit_seconds=1e-6, comm_bytes=1000.0, group_latency=1e-5)
    assert c.compute(10, 1) == c.of(10) + 7.0 and c.compute(10, 4) == c.of(10) / 4 + 7.0
    assert c.comm(10, 1) == 0.0 and c.comm(np.array([10, 10]), np.array([1, 2])).tolist()[0] == 0.0
    for d, bandwidth in ((2, 154e9), (4, 137e9), (8, 121e9), (16, 8.7e9), (64, 8.7e9)):
        assert c.bandwidth(d, 8) == bandwidth
        expected = (1000.0 * 10 * (d - 1) / d / bandwidth + 1e-5) / 1e-6
        assert c.comm(10, d, 8) == pytest.approx(expected, rel=1e-12)
        assert c.time(10, d, 8) == pytest.approx(c.compute(10, d) + c.comm(10, d, 8), rel=1e-12)
    assert c.bandwidth(1, 8) == np.inf and c.bandwidth(16, 16) == 121e9  # inside a node: the table's last value
    assert c.bandwidth(4, 2) == 8.7e9  # 4 ranks span 2 nodes of 2
    table = CostModel(intra_bandwidth=(1.0, 2.0), inter_bandwidth=(3.0, 4.0))
    assert table.bandwidth(np.array([2, 4, 8, 16, 32, 64, 128]), 8).tolist() == [1.0, 2.0, 2.0, 3.0, 4.0, 4.0, 4.0]
    out = c.time(np.array([[1], [100]]), np.array([1, 2, 4]))  # arrays broadcast, float64
    assert out.shape == (2, 3) and out.dtype == np.float64 and isinstance(c.time(5, 2), float)
    with pytest.raises(ValueError, match="gpus_per_node"):
        c.comm(10, 2, 0)


def test_defaults_are_flexsps_measurements() -> None:
    c = CostModel()
    assert (c.unit_seconds, c.comm_bytes, c.group_latency) == (5.128e-9, 2 * 4096 * 2 * 32 * 2.0, 0.0)
    assert (c.intra_bandwidth, c.inter_bandwidth) == ((154e9, 137e9, 121e9), (8.7e9,))
    assert (c.per_document, c.per_micro_batch) == (0.0, 0.0)
    # FlexSP's fitted 7B model, in units of its attention coefficient (α1 = 5.128e-6 ms per token²)
    ms = FLEXSP_7B.unit_seconds * 1e3
    assert FLEXSP_7B.of(1) * ms == pytest.approx(5.128e-6 + 0.1839576)
    assert FLEXSP_7B.per_micro_batch * ms == pytest.approx(629.3563)


@pytest.mark.parametrize(
    "bad",
    [
        {"per_document": -1.0},
        {"per_micro_batch": float("inf")},
        {"unit_seconds": 0.0},
        {"comm_bytes": float("nan")},
        {"intra_bandwidth": ()},
        {"intra_bandwidth": (0.0,)},
        {"inter_bandwidth": ("1e9",)},
        {"group_latency": -1e-6},
    ],
)
def test_bad_hybrid_fields_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        CostModel(**bad)  # type: ignore[arg-type]
