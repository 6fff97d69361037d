"""The trainer's stream across phase boundaries under the default layout (``loaders.order``): every
10-step window of the training steps stays within the goal of the build's per-step mixture where phases
change their mixture, each build sequence is read exactly once per pass, and resumes (exact, elastic, with
DataLoader workers) continue the same stream."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from contract.shards import ShardSet
from loaders import Balance, PackedDataset, PackedLoader, Payload, World
from loaders.balance import dp_imbalance
from loaders.planner import StepPlanner
from loaders.stream import stream_compositions
from mixing.output.shard_writer import write_shards
from mixing.plan.mixture import GOAL_PHASE, GOAL_WINDOW, mixture_error

S, BATCH, HEAVY = 64, 8, 4
LINEAR = 76.0  # a full-length single-document sequence costs ~1.67× a pack of short documents, as at 32k
SOURCES = ["books", "a", "b"]
# phase, steps, documents of 8 tokens of source a and of b in each light pack (8 per pack): the light
# sources change their mixture at each boundary; half of every step is full-length "books"
PHASES = (("warmup", 20, 5), ("main", 40, 4), ("anneal", 20, 3))
ONE = Payload(fields=("input_ids",))


def synthetic_build(root: Path, phases: tuple[tuple[str, int, int], ...] = PHASES) -> ShardSet:
    """Every build step holds its phase's mixture exactly: ``HEAVY`` single-document sequences of books and
    ``BATCH − HEAVY`` packs of eight 8-token documents, ``a`` of source a and the rest of b."""
    segs: list[list[int]] = []  # (source, document, start, length) per segment
    steps, offs, listed, t = [], [0], [], 0
    for name, n, a in phases:
        listed.append({"phase": name, "first_step": t, "steps": n})
        for _ in range(n):
            for j in range(BATCH):
                for src in [0] if j % 2 else [1] * a + [2] * (8 - a):  # heavy and light sequences alternate
                    segs.append([src, len(segs), 0, S if src == 0 else 8])
                offs.append(len(segs))
                steps.append(t)
            t += 1
    manifest = {
        "global_batch": BATCH,
        "cost": {"attention": 1.0, "linear": LINEAR},
        "sources": SOURCES,
        "phases": listed,
        "regroup": {"window": 20, "period": 10, "slack": 1.15},  # the mix file's recommended setting
    }
    tokens = np.zeros((len(steps), S), dtype=np.uint16)
    write_shards(root, tokens, np.array(steps), np.array(offs), np.array(segs, dtype=np.int64), 256, manifest)
    return ShardSet(root)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ShardSet:
    return synthetic_build(tmp_path_factory.mktemp("curriculum"))


def stream_error(shards: ShardSet, layout: int) -> tuple[float, float]:
    """The stream's ``mixture_error`` (window, phase) against the build's own steps."""
    offs, segs = shards.segments
    built = np.zeros((int(shards.steps.max()) + 1, len(SOURCES)))
    np.add.at(built, (np.repeat(shards.steps, np.diff(offs)), segs[:, 0]), segs[:, 3])
    planner = StepPlanner(shards, window=20, period=10, slack=1.15, layout=layout)
    phase = np.repeat(np.arange(len(PHASES)), [n for _, n, _ in PHASES])
    me = mixture_error(stream_compositions(planner), built, phase, SOURCES, [p[0] for p in PHASES])
    return me.window, me.phase


def test_every_window_across_the_boundaries_within_the_goal(shards: ShardSet) -> None:
    window, phase = stream_error(shards, layout=1)
    assert window <= GOAL_WINDOW and phase <= GOAL_PHASE, (window, phase)
    # the heaviest-first layout (layout 0) puts a phase's full-length steps first in every block:
    # windows across a boundary then see the light sources' old and new mixtures in the wrong proportion
    before, _ = stream_error(shards, layout=0)
    assert before > 2 * GOAL_WINDOW, before


def test_the_layout_keeps_the_balance(shards: ShardSet) -> None:
    planner = StepPlanner(shards, window=20, period=10, slack=1.15)
    imb = [dp_imbalance(shards.seq_cost[planner.step_sequences(t)], np.arange(BATCH), BATCH) for t in range(80)]
    assert max(imb) == pytest.approx(1.0)  # every step holds one cost class: the order moved whole steps


def test_each_sequence_once_and_phases_kept(shards: ShardSet) -> None:
    planner = StepPlanner(shards, window=20, period=10, slack=1.15)
    rows = np.stack([planner.step_sequences(t) for t in range(planner.steps)])
    assert sorted(rows.ravel().tolist()) == list(range(len(shards)))  # every sequence exactly once
    for ph in shards.manifest.phases or ():  # no sequence leaves its phase
        a, b = ph.first_step, ph.first_step + ph.steps
        assert ((shards.steps[rows[a:b]] >= a) & (shards.steps[rows[a:b]] < b)).all()
    ranks = [PackedDataset(shards.dir, world=World(r, 4), payload=ONE) for r in range(4)]
    seen = sorted(int(i["sequence"]) for i in itertools.chain.from_iterable(ranks))
    assert seen == list(range(len(shards)))  # what the ranks read in one pass


def seqs(ds: PackedDataset | PackedLoader, n: int | None = None) -> list[tuple[int, int]]:
    return [(int(i["step"]), int(i["sequence"])) for i in itertools.islice(ds, n)]


@pytest.mark.parametrize("stop", [0, 7, 19, 20, 21, 29, 30, 59, 61, 79])
def test_resume_at_any_step_is_exact(shards: ShardSet, stop: int) -> None:
    def make() -> PackedDataset:
        return PackedDataset(shards.dir, world=World(1, 4), balance=Balance(seed=3), payload=ONE)

    reference = seqs(make())
    first = make()
    head = seqs(first, stop * 2 + 1)  # 2 items a step on each of 4 ranks: stop inside step `stop`
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + seqs(resumed) == reference


@pytest.mark.parametrize("stop", [20, 30, 65])
def test_elastic_resume_reads_the_same_remaining_steps(shards: ShardSet, stop: int) -> None:
    reference = {
        x
        for r in range(4)
        for x in seqs(PackedDataset(shards.dir, world=World(r, 4), balance=Balance(seed=3), payload=ONE))
    }
    first = PackedDataset(shards.dir, world=World(0, 4), balance=Balance(seed=3), payload=ONE)
    seqs(first, stop * 2)  # a step boundary
    state = first.state_dict()
    got = set()
    for r in range(2):  # resumed on 2 ranks
        ds = PackedDataset(shards.dir, world=World(r, 2), balance=Balance(seed=3), payload=ONE)
        ds.load_state_dict(state)
        got |= set(seqs(ds))
    assert got == {x for x in reference if x[0] >= stop}


def test_a_loader_with_workers_resumes_exactly(shards: ShardSet) -> None:
    def make() -> PackedLoader:
        return PackedLoader(
            PackedDataset(shards.dir, world=World(2, 4), balance=Balance(seed=3), payload=ONE), num_workers=2
        )

    reference = seqs(PackedDataset(shards.dir, world=World(2, 4), balance=Balance(seed=3), payload=ONE))
    loader = make()
    head = seqs(loader, 47)  # past the boundary at step 20
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert head + seqs(resumed) == reference


def test_a_state_of_the_layout_before_resumes_only_on_it(shards: ShardSet) -> None:
    ds = PackedDataset(shards.dir, world=World(0, 4), balance=Balance(seed=3), payload=ONE)
    seqs(ds, 50)
    older = {k: v for k, v in ds.state_dict().items() if k != "layout"} | {"version": 2}  # before layouts were named
    with pytest.raises(ValueError, match="layout 0"):
        PackedDataset(shards.dir, world=World(0, 4), balance=Balance(seed=3), payload=ONE).load_state_dict(older)


def test_balance_layout_0_resumes_a_state_saved_before_layouts(shards: ShardSet) -> None:
    before = Balance(seed=3, layout=0)  # the heaviest-first layout, as loaders before layout 1 read this build
    ds = PackedDataset(shards.dir, world=World(0, 4), balance=before, payload=ONE)
    assert ds.settings.balance.layout == 0 == ds.planner.layout
    reference = seqs(PackedDataset(shards.dir, world=World(0, 4), balance=before, payload=ONE))
    assert reference != seqs(PackedDataset(shards.dir, world=World(0, 4), balance=Balance(seed=3), payload=ONE))
    head = seqs(ds, 50)
    older = {k: v for k, v in ds.state_dict().items() if k != "layout"} | {"version": 2}  # before layouts were named
    resumed = PackedDataset(shards.dir, world=World(0, 4), balance=before, payload=ONE)
    resumed.load_state_dict(older)
    assert head + seqs(resumed) == reference


def test_a_run_of_one_phase_keeps_the_layout_before(tmp_path: Path) -> None:
    shards = synthetic_build(tmp_path, (("main", 40, 4),))
    assert StepPlanner(shards, window=20, period=10).layout == 0  # no boundary: nothing to match
    ds = PackedDataset(shards.dir, world=World(0, 4), balance=Balance(seed=3), payload=ONE)
    seqs(ds, 50)
    older = {k: v for k, v in ds.state_dict().items() if k != "layout"} | {"version": 2}
    resumed = PackedDataset(shards.dir, world=World(0, 4), balance=Balance(seed=3), payload=ONE)
    resumed.load_state_dict(older)  # a state from before layouts were named resumes as it did
    assert (
        seqs(resumed) == seqs(PackedDataset(shards.dir, world=World(0, 4), balance=Balance(seed=3), payload=ONE))[50:]
    )
