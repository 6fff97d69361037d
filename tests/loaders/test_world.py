"""``loaders.world``: a ``World`` holds only ranks inside its ``dp_size`` × ``cp_size`` grid (``ValueError``
otherwise), and ``World.detect`` places global rank ``r`` of a world of ``n`` at ``dp_rank · cp_size + cp_rank
= r`` (CP ranks of one DP rank adjacent), every rank once, from ``RANK``/``WORLD_SIZE``, from an initialized
``torch.distributed`` group before them, else as a single rank; a world not divisible by ``cp_size`` is refused."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st

from loaders.world import World


@given(st.integers(1, 16), st.integers(1, 8), st.data())
def test_every_rank_inside_the_grid_is_a_world(dp: int, cp: int, data: st.DataObject) -> None:
    dp_rank, cp_rank = data.draw(st.integers(0, dp - 1)), data.draw(st.integers(0, cp - 1))
    w = World(dp_rank, dp, cp_rank, cp)
    assert (w.dp_rank, w.dp_size, w.cp_rank, w.cp_size) == (dp_rank, dp, cp_rank, cp)
    with pytest.raises(dataclasses.FrozenInstanceError):
        w.dp_rank = 0  # type: ignore[misc]


@given(st.integers(-2, 6), st.integers(-1, 4), st.integers(-2, 6), st.integers(-1, 4))
def test_a_rank_outside_the_grid_or_an_empty_grid_is_refused(dp_rank: int, dp: int, cp_rank: int, cp: int) -> None:
    valid = dp >= 1 and cp >= 1 and 0 <= dp_rank < dp and 0 <= cp_rank < cp
    if valid:
        World(dp_rank, dp, cp_rank, cp)
    else:
        with pytest.raises(ValueError) as err:
            World(dp_rank, dp, cp_rank, cp)
        assert "\n" not in str(err.value)


def test_the_default_world_is_a_single_rank() -> None:
    assert World() == World(0, 1, 0, 1)


@given(st.integers(1, 8), st.integers(1, 4))
def test_detect_places_every_global_rank_once_with_cp_ranks_adjacent(dp: int, cp: int) -> None:
    size = dp * cp
    seen = set()
    for rank in range(size):
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("RANK", str(rank))
            mp.setenv("WORLD_SIZE", str(size))
            w = World.detect(cp_size=cp)
        assert (w.dp_size, w.cp_size) == (dp, cp)
        assert w.dp_rank * w.cp_size + w.cp_rank == rank
        seen.add((w.dp_rank, w.cp_rank))
    assert len(seen) == size


@given(st.integers(2, 16), st.integers(2, 5))
def test_detect_refuses_a_world_not_divisible_by_cp(size: int, cp: int) -> None:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RANK", "0")
        mp.setenv("WORLD_SIZE", str(size))
        if size % cp:
            with pytest.raises(ValueError, match=f"world size {size} is not divisible by cp_size {cp}"):
                World.detect(cp_size=cp)
        else:
            assert World.detect(cp_size=cp).dp_size == size // cp


def test_detect_without_a_launcher_is_a_single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert not dist.is_initialized()
    assert World.detect() == World()
    with pytest.raises(ValueError, match="not divisible"):
        World.detect(cp_size=2)


def test_detect_a_rank_beyond_the_world_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "4")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="rank out of range"):
        World.detect()


def test_an_initialized_process_group_wins_over_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert World.detect(cp_size=2) == World(1, 4, 1, 2)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        assert World.detect() == World()  # the group's rank 0 of 1, not RANK/WORLD_SIZE
        with pytest.raises(ValueError, match="world size 1 is not divisible by cp_size 2"):
            World.detect(cp_size=2)
    finally:
        dist.destroy_process_group()
    assert World.detect(cp_size=2) == World(1, 4, 1, 2)
