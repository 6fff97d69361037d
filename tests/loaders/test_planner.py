"""``loaders.planner.StepPlanner`` on random builds (any steps, phases, sources, costs) and any settings:
every build sequence makes exactly one training step, of ``global_batch`` sequences from the build steps of
its own window (the build's step itself with ``window == 1``), windows never cross a phase; each step is
dealt to the DP ranks exactly once (equal counts, or at least one each when unequal), and the steps are the
same whatever the world and the seed (the seed only permutes which rank takes which share, and the order);
deterministic for the same settings; ``context_at`` seeds a fresh planner that resumes the same steps without
the windows before; what it cannot plan or deal is a one-line ``ValueError``.

(Edges and the figures of balance are held in test_phase_edges.py and test_balance.py.)"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.shards import ShardSet
from loaders.planner import StepPlanner
from mixing.output.shard_writer import write_shards

S = 32


@dataclass(frozen=True)
class Build:
    """A random build: ``steps`` steps of ``batch`` sequences, phases starting at ``phase_starts``, ``sources``
    sources, segments drawn from ``seed`` (some sequences one full-length document: costs differ)."""

    steps: int
    batch: int
    phase_starts: tuple[int, ...]
    sources: int
    seed: int


@st.composite
def builds(draw: st.DrawFn, min_steps: int = 1, sources: int | None = None) -> Build:
    steps = draw(st.integers(min_steps, 14))
    cuts = draw(st.lists(st.integers(1, max(1, steps - 1)), max_size=2, unique=True)) if steps > 1 else []
    return Build(
        steps=steps,
        batch=draw(st.sampled_from([2, 3, 4, 6, 8])),
        phase_starts=tuple(sorted({0, *cuts})),
        sources=sources or draw(st.integers(1, 3)),
        seed=draw(st.integers(0, 2**16)),
    )


@dataclass(frozen=True)
class Plan:
    """StepPlanner's settings."""

    window: int
    seed: int
    period: int
    micro_batches: str
    slack: float
    edge_windows: int
    layout: int

    def make(self, shards: ShardSet) -> StepPlanner:
        return StepPlanner(shards, **self.__dict__)


plans = st.builds(
    Plan,
    window=st.integers(1, 6),
    seed=st.integers(0, 2**40),
    period=st.integers(0, 4),
    micro_batches=st.sampled_from(["equal", "unequal"]),
    slack=st.sampled_from([0.0, 1.15]),
    edge_windows=st.integers(0, 2),
    layout=st.sampled_from([0, 1]),
)


def write_build(root: Path, b: Build, **info: Any) -> ShardSet:
    rng = np.random.default_rng(b.seed)
    segs: list[list[int]] = []  # (source, document, start, length) per segment
    offs = [0]
    for _ in range(b.steps * b.batch):
        if rng.random() < 0.3:
            lengths = [S]
        else:
            lengths = rng.integers(1, 12, rng.integers(1, 6)).tolist()
            lengths = [x for x, c in zip(lengths, np.cumsum(lengths), strict=True) if c <= S] or [1]
        segs += [[int(rng.integers(b.sources)), len(segs) + k, 0, x] for k, x in enumerate(lengths)]
        offs.append(len(segs))
    bounds = [*b.phase_starts, b.steps]
    manifest = {
        "global_batch": b.batch,
        "cost": {"attention": 1.0, "linear": 8.0},
        "sources": [f"s{k}" for k in range(b.sources)],
        "phases": [
            {"phase": f"p{k}", "first_step": a, "steps": z - a} for k, (a, z) in enumerate(itertools.pairwise(bounds))
        ],
        **info,
    }
    steps = np.repeat(np.arange(b.steps), b.batch)
    tokens = np.zeros((len(steps), S), dtype=np.uint16)
    write_shards(root, tokens, steps, np.array(offs), np.array(segs, dtype=np.int64), 5, manifest)
    return ShardSet(root)


@contextmanager
def built(b: Build, **info: Any) -> Iterator[ShardSet]:
    with tempfile.TemporaryDirectory() as tmp:
        yield write_build(Path(tmp), b, **info)


def dp_sizes(planner: StepPlanner) -> list[int]:
    """Every world the planner can deal a step to."""
    B = planner.global_batch
    return [d for d in range(1, B + 1) if planner.micro_batches == "unequal" or B % d == 0]


def every_step(planner: StepPlanner) -> np.ndarray:
    return np.stack([planner.step_sequences(t) for t in range(planner.steps)])


SETTINGS = settings(max_examples=25)


@SETTINGS
@given(builds(), plans)
def test_every_sequence_makes_one_step_from_its_own_window(b: Build, plan: Plan) -> None:
    with built(b) as shards:
        planner = plan.make(shards)
        assert planner.steps == b.steps
        rows = every_step(planner)
        assert rows.dtype == np.int64 and rows.shape == (b.steps, b.batch)
        assert sorted(rows.ravel().tolist()) == list(range(len(shards)))  # each sequence exactly once
        assert (np.diff(rows, axis=1) > 0).all()  # each step's sequences sorted
        starts = planner.window_starts
        assert starts[0] == 0 and starts[-1] == b.steps and (np.diff(starts) > 0).all()
        assert set(b.phase_starts) <= set(starts.tolist())  # a window never crosses a phase
        assert (np.diff(starts) <= plan.window + max(plan.period - 1, 0)).all()  # a tail < period joins one
        for t in range(b.steps):
            w = planner.window_of(t)
            assert starts[w] <= t < starts[w + 1]
            from_steps = shards.steps[rows[t]]
            assert ((from_steps >= starts[w]) & (from_steps < starts[w + 1])).all(), t
            if plan.window == 1:
                assert (from_steps == t).all()


@SETTINGS
@given(builds(), plans, st.integers(0, 2**40))
def test_each_step_is_dealt_once_and_the_steps_are_the_same_whatever_the_world_and_seed(
    b: Build, plan: Plan, other_seed: int
) -> None:
    with built(b) as shards:
        alone = every_step(plan.make(shards))  # a planner never asked for any world
        planner = plan.make(shards)
        reseeded = Plan(**{**plan.__dict__, "seed": other_seed}).make(shards)
        for dp in dp_sizes(planner):
            planner.check_world(dp)
            for t in range(b.steps):
                parts = planner.assignment(t, dp)
                assert len(parts) == dp and all(p.dtype == np.int64 for p in parts)
                assert sorted(np.concatenate(parts).tolist()) == alone[t].tolist(), (dp, t)
                counts = [len(p) for p in parts]
                assert counts == [planner.count(t, dp, r) for r in range(dp)]
                if plan.micro_batches == "equal":
                    assert counts == [b.batch // dp] * dp
                else:
                    assert min(counts) >= 1
                # another seed: the same step, the same shares, perhaps to other ranks and in another order
                shares = sorted(sorted(p.tolist()) for p in parts)
                assert shares == sorted(sorted(p.tolist()) for p in reseeded.assignment(t, dp))
        assert np.array_equal(every_step(planner), alone) and np.array_equal(every_step(reseeded), alone)


@SETTINGS
@given(builds(), plans)
def test_deterministic_for_the_same_build_and_settings(b: Build, plan: Plan) -> None:
    with built(b) as shards:
        first, again = plan.make(shards), plan.make(ShardSet(shards.dir))
        dp = dp_sizes(first)[-1]
        forward = [first.assignment(t, dp) for t in range(b.steps)]
        backward = [again.assignment(t, dp) for t in reversed(range(b.steps))][::-1]  # windows planned lazily
        for t in range(b.steps):
            assert all(np.array_equal(x, y) for x, y in zip(forward[t], backward[t], strict=True)), t
            assert first.context_at(t) == again.context_at(t)


refined = st.builds(
    Plan,
    window=st.integers(2, 6),
    seed=st.integers(0, 2**40),
    period=st.integers(1, 4),
    micro_batches=st.just("equal"),
    slack=st.just(1.15),
    edge_windows=st.integers(0, 2),
    layout=st.sampled_from([0, 1]),
)


@SETTINGS
@given(builds(min_steps=3, sources=3), refined, st.data())
def test_a_planner_seeded_with_context_at_a_step_resumes_the_same_steps(
    b: Build, plan: Plan, data: st.DataObject
) -> None:
    with built(b) as shards:
        whole = plan.make(shards)
        rows = every_step(whole)
        stop = data.draw(st.integers(0, b.steps - 1))
        context = whole.context_at(stop)
        assert context is not None
        k = min(plan.period - 1, int(whole.window_starts[whole.window_of(stop)]))
        assert np.asarray(context, dtype=np.int64).reshape(-1, 3).shape == (k, 3)
        resumed = plan.make(ShardSet(shards.dir))
        resumed.seed_context(stop, context)
        for t in range(stop, b.steps):
            assert np.array_equal(resumed.step_sequences(t), rows[t]), (stop, t)
            assert resumed.context_at(t) == whole.context_at(t)
        resumed.seed_context(stop, context)  # the same context again is fine
        # a context of another shape, or one that differs from what the planner knows, belongs elsewhere
        with pytest.raises(ValueError, match="shape") as err:
            plan.make(ShardSet(shards.dir)).seed_context(stop, [[1, 2, 3]] * (k + 1))
        assert "\n" not in str(err.value)
        if k:
            other = (np.asarray(context) + 1).tolist()
            with pytest.raises(ValueError, match="differs"):
                resumed.seed_context(stop, other)


@pytest.mark.parametrize(
    ("b", "window", "period", "stop"),
    [
        (Build(steps=3, batch=2, phase_starts=(0, 1, 2), sources=3, seed=0), 2, 3, 1),
        (Build(steps=30, batch=2, phase_starts=(0, 5, 10), sources=3, seed=1), 20, 10, 5),  # phases of 5, 5, 20
    ],
)
def test_a_resume_where_windows_are_shorter_than_the_context(b: Build, window: int, period: int, stop: int) -> None:
    """The window after a resume reaches back past the seeded window: the seed holds those steps."""
    plan = Plan(window=window, seed=0, period=period, micro_batches="equal", slack=1.15, edge_windows=0, layout=1)
    with built(b) as shards:
        whole = plan.make(shards)
        rows = every_step(whole)
        resumed = plan.make(ShardSet(shards.dir))
        resumed.seed_context(stop, whole.context_at(stop))
        assert all(np.array_equal(resumed.step_sequences(t), rows[t]) for t in range(stop, b.steps))


@SETTINGS
@given(builds(), plans.filter(lambda p: not (p.slack and p.period and p.window > 1)), st.data())
def test_an_unrefined_planner_needs_no_context(b: Build, plan: Plan, data: st.DataObject) -> None:
    with built(b) as shards:
        planner = plan.make(shards)
        rows = every_step(planner)
        stop = data.draw(st.integers(0, b.steps - 1))
        assert planner.context_at(stop) is None and planner.shared_contexts(stop) == {}
        resumed = plan.make(ShardSet(shards.dir))
        resumed.seed_context(stop, None)
        resumed.seed_context(stop, [[5, 5, 5]])  # ignored: nothing to seed
        assert all(np.array_equal(resumed.step_sequences(t), rows[t]) for t in range(stop, b.steps))


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ShardSet:
    return write_build(
        tmp_path_factory.mktemp("planner"), Build(steps=6, batch=4, phase_starts=(0, 3), sources=2, seed=3)
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "window must be ≥ 1"),
        ({"period": -1}, "period must be ≥ 0"),
        ({"micro_batches": "even"}, "micro_batches must be one of"),
        ({"edge_windows": -1}, "edge_windows must be ≥ 0"),
        ({"layout": 2}, "layout must be one of"),
    ],
)
def test_bad_settings_are_refused_in_one_line(shards: ShardSet, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        StepPlanner(shards, **kwargs)
    assert "\n" not in str(err.value)


def test_a_world_it_cannot_deal_a_step_to_is_refused(shards: ShardSet) -> None:
    equal, unequal = StepPlanner(shards), StepPlanner(shards, micro_batches="unequal")
    with pytest.raises(ValueError, match="global_batch 4 is not divisible by dp_size 3"):
        equal.check_world(3)
    with pytest.raises(ValueError, match="not divisible"):
        equal.assignment(0, 3)
    unequal.check_world(3)
    assert sorted(len(p) for p in unequal.assignment(0, 3)) == [1, 1, 2]
    with pytest.raises(ValueError, match="global_batch 4 gives no sequence to some of dp_size 5"):
        unequal.check_world(5)


def test_a_token_budget_below_an_equal_share_is_refused(tmp_path: Path) -> None:
    b = Build(steps=2, batch=4, phase_starts=(0,), sources=1, seed=0)
    tight = StepPlanner(write_build(tmp_path / "tight", b, max_tokens=2 * S - 1), micro_batches="unequal")
    with pytest.raises(ValueError, match=f"max_tokens {2 * S - 1} cannot hold an equal share"):
        tight.check_world(2)
    roomy = StepPlanner(write_build(tmp_path / "roomy", b, max_tokens=2 * S), micro_batches="unequal")
    roomy.check_world(2)
    assert StepPlanner(write_build(tmp_path / "equal", b, max_tokens=1)).max_tokens is None  # equal: no budget


def test_a_build_without_a_global_batch_or_with_an_uneven_step_is_refused(tmp_path: Path) -> None:
    b = Build(steps=2, batch=4, phase_starts=(0,), sources=1, seed=0)
    with pytest.raises(ValueError, match="records no global_batch"):
        StepPlanner(write_build(tmp_path / "none", b, global_batch=None))
    offs = np.arange(9)
    segs = np.array([[0, i, 0, S] for i in range(8)], dtype=np.int64)
    steps = np.array([0, 0, 0, 1, 1, 1, 1, 1])
    write_shards(tmp_path / "uneven", np.zeros((8, S), np.uint16), steps, offs, segs, 8, {"global_batch": 4})
    with pytest.raises(ValueError, match="build step 0 has 3 sequences, expected global_batch 4"):
        StepPlanner(ShardSet(tmp_path / "uneven"))
