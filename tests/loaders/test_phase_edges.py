"""The mixture the trainer receives across phase boundaries: with edges (``edge_windows``),
regrouped and refined windows keep every 10-step window of the *training* steps on the build's per-step
mixture, phases included, with each build sequence read exactly once and resumes exact; the stream's
composition is computed without reading tokens, and ``weir inspect`` reports it."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from contract.shards import ShardSet
from loaders import Balance, PackedDataset, Payload, World
from loaders.balance import dp_imbalance
from loaders.planner import StepPlanner
from loaders.stream import stream_compositions, stream_planner
from mixing.output.shard_writer import write_shards
from mixing.plan.mixture import (
    GOAL_PHASE,
    GOAL_WINDOW,
    MixtureError,
    compositions_mixture_error,
    mixture_error,
    shards_mixture_error,
)
from tests.conftest import ROOT, TINY_MIX, write_tiny_sources

S, BATCH = 64, 8
LINEAR = 76.0  # a full-length single-document sequence costs ~1.67× a pack of short documents, as at 32k
# three phases of unequal cost: short documents only, 40 % full-length "books", 20 % of them
PHASES = (("warmup", 10, 0.0, [1, 1, 1, 1]), ("main", 30, 0.5, [3, 1, 2, 1]), ("anneal", 10, 0.25, [1, 3, 1, 2]))


def synthetic_build(root: Path, seed: int = 0) -> ShardSet:
    """A build whose every step holds its phase's mixture: ``round(heavy × 16)`` (alternating so that the
    phase's mean is exact) single-segment sequences of source 0, the rest packs of 8-token documents of
    sources 1–4 drawn by the phase's weights."""
    rng = np.random.default_rng(seed)
    segs: list[list[int]] = []  # (source, document, start, length) per segment
    steps, offs, phases, t = [], [0], [], 0
    for name, n, heavy, weights in PHASES:
        phases.append({"phase": name, "first_step": t, "steps": n})
        p = np.array(weights, dtype=np.float64) / sum(weights)
        for k in range(n):
            h = int(np.floor(heavy * BATCH * (k + 1)) - np.floor(heavy * BATCH * k))
            for j in range(BATCH):
                if j < h:
                    segs.append([0, len(segs), 0, S])
                else:
                    for src in rng.choice(4, size=S // 8, p=p) + 1:
                        segs.append([int(src), len(segs), 0, 8])
                offs.append(len(segs))
                steps.append(t)
            t += 1
    manifest = {
        "global_batch": BATCH,
        "cost": {"attention": 1.0, "linear": LINEAR},
        "sources": ["books", "a", "b", "c", "d"],
        "phases": phases,
        "regroup": {"window": 10, "period": 10, "slack": 1.15},
    }
    tokens = np.zeros((len(steps), S), dtype=np.uint16)
    write_shards(root, tokens, np.array(steps), np.array(offs), np.array(segs, dtype=np.int64), 256, manifest)
    return ShardSet(root)


def stream_mixture_error(shards: ShardSet, quotas: pl.DataFrame, window: int | None = None) -> MixtureError:
    """``mixture_error`` of the training steps a :class:`loaders.PackedDataset` reads (regroup ``window``;
    default: the manifest's) against the plan's ``quotas``."""
    steps = stream_compositions(stream_planner(shards, Balance(window=window)))
    return compositions_mixture_error(steps, list(shards.manifest.sources or ()), quotas)


def build_compositions(shards: ShardSet) -> np.ndarray:
    offs, segs = shards.segments
    out = np.zeros((int(shards.steps.max()) + 1, 5))
    np.add.at(out, (np.repeat(shards.steps, np.diff(offs)), segs[:, 0]), segs[:, 3])
    return out


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> ShardSet:
    return synthetic_build(tmp_path_factory.mktemp("edges"))


def test_every_window_and_phase_of_the_stream_on_the_build_mixture(shards: ShardSet) -> None:
    planner = StepPlanner(shards, window=10, period=10, slack=1.15, edge_windows=2)
    got, want = stream_compositions(planner), build_compositions(shards)
    phase = np.repeat(np.arange(3), [n for _, n, *_ in PHASES])
    names = [p[0] for p in PHASES]
    me = mixture_error(got, want, phase, ["books", "a", "b", "c", "d"], names)
    assert me.window <= GOAL_WINDOW, me
    assert me.phase <= GOAL_PHASE, me
    # what it gives up for it: steps mix cost classes only where windows need it (here most steps, a run
    # this short at 8 sequences a step has no room to reach the one-class template), never more than built
    imb = [dp_imbalance(shards.seq_cost[planner.step_sequences(t)], np.arange(BATCH), BATCH) for t in range(50)]
    built = [dp_imbalance(c, np.arange(BATCH), BATCH) for c in _build_costs(shards)]
    assert np.mean(imb) <= np.mean(built) + 1e-9, (np.mean(imb), np.mean(built))


def _build_costs(shards: ShardSet) -> list[np.ndarray]:
    return [shards.seq_cost[shards.steps == t] for t in range(int(shards.steps.max()) + 1)]


def test_each_sequence_once_and_phases_kept(shards: ShardSet) -> None:
    planner = StepPlanner(shards, window=10, period=10, slack=1.15, edge_windows=2)
    rows = np.stack([planner.step_sequences(t) for t in range(planner.steps)])
    assert sorted(rows.ravel().tolist()) == list(range(len(shards)))  # every sequence exactly once
    assert (shards.steps[rows] == np.arange(planner.steps)[:, None]).sum() < rows.size  # it did regroup
    assert shards.manifest.phases is not None
    for ph in shards.manifest.phases:  # no sequence leaves its phase
        a, b = ph.first_step, ph.first_step + ph.steps
        assert ((shards.steps[rows[a:b]] >= a) & (shards.steps[rows[a:b]] < b)).all()


def test_the_stream_error_is_what_the_ranks_read(shards: ShardSet) -> None:
    """The library figure equals the composition of the items the DP ranks actually receive."""
    ranks = [PackedDataset(shards.dir, world=World(r, 4), payload=Payload(fields=("input_ids",))) for r in range(4)]
    offs, segs = shards.segments
    got = np.zeros((int(shards.steps.max()) + 1, 5), dtype=np.int64)
    for item in itertools.chain.from_iterable(ranks):
        lo, hi = offs[item["sequence"]], offs[item["sequence"] + 1]
        np.add.at(got[item["step"]], segs[lo:hi, 0], segs[lo:hi, 3])
    assert np.array_equal(got, stream_compositions(ranks[0].planner))
    phases, sources = shards.manifest.phases, shards.manifest.sources
    assert phases is not None and sources is not None
    quotas = pl.DataFrame(
        [
            {"step": t, "phase": ph.phase, "source": s, "quota": int(v)}
            for ph in phases
            for t in range(ph.first_step, ph.first_step + ph.steps)
            for s, v in zip(sources, build_compositions(shards)[t], strict=True)
        ]
    )
    stream, built = stream_mixture_error(shards, quotas), shards_mixture_error(shards, quotas)
    assert built.window == 0.0 and stream.window > 0.0  # the build's steps are the plan here; the stream strays
    assert stream_mixture_error(shards, quotas, window=1).window == 0.0  # no regrouping: the build's steps


EDGES = Balance(seed=2, edges=2)  # the loader's default is off


def seqs(ds: PackedDataset, n: int | None = None) -> list[tuple[int, int]]:
    return [(int(i["step"]), int(i["sequence"])) for i in itertools.islice(ds, n)]


def edge_dataset(shards: ShardSet, balance: Balance = EDGES) -> PackedDataset:
    return PackedDataset(shards.dir, world=World(1, 4), balance=balance, payload=Payload(fields=("input_ids",)))


def test_the_loaders_edges_are_the_planners(shards: ShardSet) -> None:
    ds = edge_dataset(shards)
    assert ds.settings.balance.edges == 2 == ds.planner.edge_windows and ds.state_dict()["edges"] == 2
    planner = StepPlanner(shards, window=10, period=10, slack=1.15, edge_windows=2)  # the build's regroup
    assert [ds.planner.step_sequences(t).tolist() for t in range(50)] == [
        planner.step_sequences(t).tolist() for t in range(50)
    ]
    plain = edge_dataset(shards, Balance(seed=2))
    assert plain.planner.edge_windows == 0 and any(
        (ds.planner.step_sequences(t) != plain.planner.step_sequences(t)).any() for t in range(50)
    )  # edges change the training steps here
    no_refinement = edge_dataset(shards, Balance(seed=2, edges=2, slack=0.0))
    assert no_refinement.planner.edge_windows == 0  # edges are refined windows: nothing to do without


@pytest.mark.parametrize("stop", [0, 5, 9, 10, 13, 38, 41, 49])
def test_resume_at_any_step_across_the_edges(shards: ShardSet, stop: int) -> None:
    reference = seqs(edge_dataset(shards))
    first = edge_dataset(shards)
    head = seqs(first, stop * 2)  # 2 items a step on each of 4 ranks
    resumed = edge_dataset(shards)
    resumed.load_state_dict(first.state_dict())
    assert head + seqs(resumed) == reference


def test_a_state_with_edges_resumes_only_with_them(shards: ShardSet) -> None:
    first = edge_dataset(shards)
    seqs(first, 30)
    with pytest.raises(ValueError, match=r"edges 2.*edges 0"):
        edge_dataset(shards, Balance(seed=2)).load_state_dict(first.state_dict())
    older = {k: v for k, v in edge_dataset(shards, Balance(seed=2)).state_dict().items() if k != "edges"}
    older["version"] = 2
    edge_dataset(shards, Balance(seed=2)).load_state_dict(older)  # a state from before edges were named: none


def test_inspect_reports_the_trainers_stream_beside_the_build(tmp_path: Path) -> None:
    write_tiny_sources(tmp_path / "data")
    mix = TINY_MIX.format(root=tmp_path / "data").replace("steps: 3", "steps: 4").replace("steps: 5", "steps: 6")
    (tmp_path / "m.yaml").write_text(mix + "balance: {regroup: {window: 2, period: 2}}\n")
    weir = [sys.executable, "-m", "pipelines.cli"]
    built = subprocess.run(
        [*weir, "build", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "b")],
        check=True, cwd=ROOT, capture_output=True, text=True,
    )  # fmt: skip
    assert "mixture_error of the trainer's stream (regroup window 2, period 2" in built.stdout
    shown = subprocess.run([*weir, "inspect", str(tmp_path / "b"), "--json"], check=True, cwd=ROOT, capture_output=True)
    report = json.loads(shown.stdout)
    stream = report["mixture_error_stream"]
    assert stream["regroup"] == {"window": 2, "period": 2, "slack": 1.15}
    with duckdb.connect(str(tmp_path / "b" / "weir.duckdb"), read_only=True) as con:
        quotas = con.sql("SELECT step, phase, source, quota FROM plan_quotas").pl()
    direct = stream_mixture_error(ShardSet(tmp_path / "b" / "shards"), quotas)
    assert (stream["window"], stream["phase"]) == (direct.window, direct.phase)
    assert "window" in report["mixture_error"]  # the build's own, beside it
