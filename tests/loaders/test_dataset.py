"""PackedDataset: what it yields, how DP×CP ranks split it, exact and elastic resume."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from contract.manifest import write_manifest
from contract.shards import ShardSet
from loaders import IGNORE_INDEX, Balance, PackedDataset, PackedLoader, Payload, StateError, World


def items(ds, n: int | None = None) -> list[dict]:
    """The first ``n`` items (all when None), pulling no item beyond them."""
    return list(itertools.islice(ds, n))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


def full_views(ds: PackedDataset, item: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tokens, labels and positions of the whole sequence behind ``item`` (a cp_size=1 read)."""
    whole = PackedDataset(ds.shards.dir, world=World(0, 1)).item(item["sequence"])
    return whole["input_ids"].numpy(), whole["labels"].numpy(), whole["position_ids"].numpy()


def test_items_have_consistent_boundaries_labels_and_positions(tiny_build: Path) -> None:
    ds = PackedDataset(tiny_build, world=World(0, 1))
    shards = ShardSet(tiny_build / "shards")
    steps = []
    for item in items(ds):
        x, y, pos, cu = item["input_ids"], item["labels"], item["position_ids"], item["cu_seqlens"]
        S = ds.facts.seq_len
        assert x.shape == y.shape == pos.shape == (S,) and x.dtype == torch.int64
        assert cu.dtype == torch.int32 and cu[0] == 0 and cu[-1] == S and bool((cu[1:] > cu[:-1]).all())
        assert torch.equal(x, torch.from_numpy(shards.sequence(item["sequence"]).tokens.astype(np.int64)))
        real = int(shards.sequence(item["sequence"]).segments[:, 3].sum())
        for a, b in itertools.pairwise(cu.tolist()):
            assert torch.equal(pos[a:b], torch.arange(b - a))  # positions restart at each document
            if b <= real:
                assert torch.equal(y[a : b - 1], x[a + 1 : b])  # next token inside the document
            assert y[b - 1] == IGNORE_INDEX  # never across a boundary
        assert bool((y[real:] == IGNORE_INDEX).all())
        steps.append(item["step"])
    assert steps == sorted(steps) and len(steps) == len(shards)


@pytest.mark.parametrize("cp", [2, 4])
def test_cp_ranks_hold_every_slot_once_with_its_own_labels_and_positions(tiny_build: Path, cp: int) -> None:
    parts = [items(PackedDataset(tiny_build, world=World(0, 1, c, cp))) for c in range(cp)]
    for ranks in zip(*parts, strict=True):
        x, y, pos = full_views(PackedDataset(tiny_build, world=World(0, 1)), ranks[0])
        assert len({len(r["indices"]) for r in ranks}) == 1
        flat = torch.cat([r["indices"] for r in ranks]).numpy()
        assert sorted(flat[flat >= 0].tolist()) == list(range(len(x)))
        n_seg = len(ranks[0]["cu_seqlens"]) - 1
        assert all(len(r["indices"]) * cp == r["cu_seqlens_padded"][-1] for r in ranks)
        assert (flat < 0).sum() <= 2 * cp * n_seg  # at most 2·cp padding slots per document
        for r in ranks:
            idx = r["indices"].numpy()
            ok = idx >= 0
            assert np.array_equal(r["input_ids"].numpy()[ok], x[idx[ok]])
            assert np.array_equal(r["labels"].numpy()[ok], y[idx[ok]])
            assert np.array_equal(r["position_ids"].numpy()[ok], pos[idx[ok]])
            assert bool((r["labels"].numpy()[~ok] == IGNORE_INDEX).all())


@pytest.mark.parametrize("window", [1, 3])
def test_dp_ranks_partition_every_step(tiny_build: Path, window: int) -> None:
    full = ShardSet(tiny_build / "shards")
    per_step: dict[int, list[int]] = defaultdict(list)
    for r in range(2):
        got = items(PackedDataset(tiny_build, world=World(r, 2), balance=Balance(seed=3, window=window)))
        assert len(got) == len(full) // 2
        assert set(Counter(g["step"] for g in got).values()) == {2}
        for g in got:
            per_step[g["step"]].append(g["sequence"])
    assert sorted(s for v in per_step.values() for s in v) == list(range(len(full)))
    if window == 1:  # training steps are the build's steps exactly
        assert all(sorted(v) == np.flatnonzero(full.steps == t).tolist() for t, v in per_step.items())
    else:  # regrouping stays inside a phase
        phase = {t: 0 if t < 3 else 1 for t in per_step}
        assert all(phase[t] == phase[int(full.steps[s])] for t, v in per_step.items() for s in v)


@pytest.mark.parametrize(
    ("stop", "window", "cp", "period"),
    [(0, 1, 1, 0), (1, 1, 2, 0), (5, 3, 1, 0), (9, 3, 2, 0), (15, 1, 1, 0), (7, 2, 1, 1)],
)
def test_resume_gives_exactly_the_uninterrupted_stream(
    tiny_build: Path, stop: int, window: int, cp: int, period: int
) -> None:
    def make() -> PackedDataset:
        return PackedDataset(
            tiny_build, world=World(1, 2, cp - 1, cp), balance=Balance(seed=11, window=window, period=period)
        )

    reference = items(make())
    first = make()
    head = items(first, stop)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    tail = items(resumed)
    assert len(head) + len(tail) == len(reference)
    assert all(same(a, b) for a, b in zip(head + tail, reference, strict=True))


@pytest.mark.parametrize("stop", [0, 3, 6])
def test_loader_with_workers_resumes_exactly(tiny_build: Path, stop: int) -> None:
    def make() -> PackedLoader:
        return PackedLoader(
            PackedDataset(tiny_build, world=World(0, 2), balance=Balance(seed=5, window=3)),
            num_workers=2,
            prefetch_factor=4,
        )

    reference = items(PackedDataset(tiny_build, world=World(0, 2), balance=Balance(seed=5, window=3)))
    loader = make()
    head = items(loader, stop)  # workers have prefetched beyond `stop`; the state must not count those
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    tail = items(resumed)
    assert [i["sequence"] for i in head + tail] == [i["sequence"] for i in reference]
    assert all(same(a, b) for a, b in zip(head + tail, reference, strict=True))


def step_tokens(streams: list[list[dict]]) -> dict[int, Counter]:
    """Per training step, the multiset of real tokens gathered over all ranks' items."""
    out: dict[int, Counter] = defaultdict(Counter)
    for stream in streams:
        for it in stream:
            out[it["step"]].update(it["input_ids"][it["indices"] >= 0].tolist())
    return out


@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize(("dp", "cp"), [(2, 1), (4, 2), (1, 4)])
def test_elastic_resume_keeps_every_remaining_steps_tokens(tiny_build: Path, window: int, dp: int, cp: int) -> None:
    stop_step = 4  # inside the second window when window=3: steps do not depend on the world
    reference = step_tokens(
        [items(PackedDataset(tiny_build, world=World(r, 4), balance=Balance(seed=2, window=window))) for r in range(4)]
    )
    states = []
    for r in range(4):
        ds = PackedDataset(tiny_build, world=World(r, 4), balance=Balance(seed=2, window=window))
        items(ds, stop_step)  # one sequence per rank per step: stop at a step boundary
        states.append(ds.state_dict())
    assert {s["step"] for s in states} == {stop_step} and {s["consumed"] for s in states} == {0}
    resumed = []
    for r in range(dp * cp):
        ds = PackedDataset(tiny_build, world=World(r // cp, dp, r % cp, cp), balance=Balance(seed=2, window=window))
        ds.load_state_dict(states[0])
        resumed.append(items(ds))
    got = step_tokens(resumed)
    assert got == {t: c for t, c in reference.items() if t >= stop_step}


def test_refuses_states_it_cannot_resume(tiny_build: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(tiny_build / "shards", other)
    manifest = json.loads((other / "manifest.json").read_text())
    write_manifest(other, {**manifest, "mix_fingerprint": "another mix"})
    ds = PackedDataset(tiny_build, world=World(0, 2))
    items(ds, 1)  # inside step 0
    state = ds.state_dict()
    with pytest.raises(StateError, match="step boundary"):
        PackedDataset(tiny_build, world=World(0, 4)).load_state_dict(state)
    PackedDataset(tiny_build, world=World(0, 2, 1, 2)).load_state_dict(state)  # another cp_size inside a step is fine
    with pytest.raises(StateError, match="another build"):
        PackedDataset(other, world=World(0, 2)).load_state_dict(state)
    with pytest.raises(StateError, match="seed"):
        PackedDataset(tiny_build, world=World(0, 2), balance=Balance(seed=1)).load_state_dict(state)
    with pytest.raises(StateError, match="period"):
        PackedDataset(tiny_build, world=World(0, 2), balance=Balance(period=2)).load_state_dict(state)
    older = {k: v for k, v in state.items() if k != "period"} | {"version": 2}  # before the period option existed
    PackedDataset(tiny_build, world=World(0, 2)).load_state_dict(older)
    with pytest.raises(StateError, match="version"):
        PackedDataset(tiny_build, world=World(0, 2)).load_state_dict({"next": 3})


def test_world_comes_from_the_environment(tiny_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert World.detect(cp_size=2) == World(dp_rank=2, dp_size=4, cp_rank=1, cp_size=2)
    ds = PackedDataset(tiny_build, world=World.detect(cp_size=2))
    assert ds.world == World(dp_rank=2, dp_size=4, cp_rank=1, cp_size=2)
    with pytest.raises(ValueError, match="not divisible"):
        World.detect(cp_size=3)


def test_dataloader_workers_split_without_duplicates(tiny_build: Path) -> None:
    ds = PackedDataset(tiny_build, world=World(0, 2))
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    got = sorted(item["sequence"] for item in loader)
    assert got == sorted(ds.rank_sequences().tolist())


def test_a_new_loader_pass_continues_where_the_consumer_stopped(tiny_build: Path) -> None:
    reference = [i["sequence"] for i in items(PackedDataset(tiny_build, world=World(1, 2), balance=Balance(seed=8)))]
    loader = PackedLoader(PackedDataset(tiny_build, world=World(1, 2), balance=Balance(seed=8)), num_workers=2)
    first = [i["sequence"] for i in items(loader, 5)]
    second = [i["sequence"] for i in items(loader)]
    assert first + second == reference
    with pytest.raises(ValueError, match="persistent_workers"):
        PackedLoader(PackedDataset(tiny_build, world=World(0, 1)), num_workers=1, persistent_workers=True)


def test_resume_at_random_points_with_and_without_workers(tiny_build: Path) -> None:
    rng = np.random.default_rng(2026)
    for _ in range(6):
        dp = int(rng.choice([1, 2, 4]))
        cp = int(rng.choice([1, 2]))
        balance = Balance(seed=int(rng.integers(100)), window=int(rng.choice([1, 2, 3])))
        rank = (int(rng.integers(dp)), int(rng.integers(cp)))

        def make(rank=rank, dp=dp, cp=cp, balance=balance) -> PackedDataset:
            return PackedDataset(tiny_build, world=World(rank[0], dp, rank[1], cp), balance=balance)

        reference = items(make())
        stop = int(rng.integers(len(reference) + 1))
        workers = int(rng.choice([0, 2]))
        loader = PackedLoader(make(), num_workers=workers)
        head = items(loader, stop)
        resumed = PackedLoader(make(), num_workers=2 - workers)  # another worker count on resume
        resumed.load_state_dict(loader.state_dict())
        tail = items(resumed)
        assert all(same(a, b) for a, b in zip(head + tail, reference, strict=True)), (dp, cp, balance, stop)


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_chunked_items_equal_single_items(tiny_build: Path, chunk: int) -> None:
    # the chunked fast path (cp_size 1) builds exactly what item() builds, padding included
    ds = PackedDataset(tiny_build, world=World(0, 1), payload=Payload(chunk=chunk))
    order = ds.rank_sequences().tolist()
    got = items(ds)
    assert [g["sequence"] for g in got] == order
    padded = 0
    for g in got:
        want = ds.item(g["sequence"])
        padded += int((want["labels"] == IGNORE_INDEX).sum()) > len(want["cu_seqlens"]) - 1
        want.update(step=g["step"], slot=g["slot"])
        assert same(g, want)
    assert padded  # the tiny build has sequences ending in padding


@pytest.mark.parametrize("cp", [1, 2])
def test_reused_arrays_never_change_an_item_still_held(tiny_build: Path, cp: int) -> None:
    # chunks reuse their arrays once no item of theirs is alive: the tensors a consumer keeps must stay intact
    ds = PackedDataset(tiny_build, world=World(0, 1, 0, cp), payload=Payload(chunk=2))
    kept = [(g["sequence"], g["labels"], g["position_ids"][3:], g["indices"]) for k, g in enumerate(ds) if k % 3 == 0]
    assert all(len(pool) <= 4 for pool in ds._builder._pool.values())
    assert "cp_labels" in ds._builder._pool if cp > 1 else "labels" in ds._builder._pool
    for i, labels, pos, indices in kept:
        want = ds.item(i)
        assert torch.equal(labels, want["labels"]) and torch.equal(pos, want["position_ids"][3:])
        assert torch.equal(indices, want["indices"])


def test_a_position_the_build_does_not_have_is_refused_in_one_line(tiny_build: Path) -> None:
    ds = PackedDataset(tiny_build, world=World(0, 2))
    state = ds.state_dict()
    steps, per_rank = ds.planner.steps, ds.per_rank
    for bad, message in [
        ({"step": steps + 1}, f"at step {steps + 1}; this build has {steps} training steps"),
        ({"step": 3, "consumed": per_rank}, f"{per_rank} sequences of step 3 delivered; this rank reads {per_rank}"),
        ({"step": steps, "consumed": 1}, f"1 sequences of step {steps} delivered; this rank reads 0"),
    ]:
        with pytest.raises(StateError, match=re.escape(message)) as e:
            PackedDataset(tiny_build, world=World(0, 2)).load_state_dict(state | bad)
        assert "\n" not in str(e.value)
    last = PackedDataset(tiny_build, world=World(0, 2))
    last.load_state_dict(state | {"step": 3, "consumed": per_rank - 1})
    assert len(last) == (steps - 3) * per_rank - (per_rank - 1)
    done = PackedDataset(tiny_build, world=World(0, 2))
    done.load_state_dict(state | {"step": steps})
    assert done.exhausted
