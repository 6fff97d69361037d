"""The builds ``benchmarks/hybrid.py`` prices: simulated ones (three-phase curricula drawn and packed as a build
would) and finished build folders, each reduced to what the layouts need (:class:`Build`).

- :class:`Build`: a build's sequences' segments (source, length, int64), its steps of ``batch`` sequences, its
  cost model, the plan's tokens per step and source, its phases, and the loader's planners over its steps.
- :func:`simulated_build`: ``benchmarks/curriculum.py``'s ``ramps`` curriculum drawn from given per-source
  lengths (``benchmarks/simulation.py``'s draw), packed by weir's packer (:func:`weir_packed`) or best-fit
  decreasing; deterministic for a seed.
- :func:`real_build`: a finished build folder (its shards, manifest and plan quotas).
- :func:`step_documents`: the documents (lengths) of one build step, the unit every layout deals.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.curriculum import curriculum, planned_shares
from benchmarks.simulation import COST, MIXTURE, SimulatedShards, Step, bfd, draw
from contract.cost import CostModel
from loaders.planner import StepPlanner
from loaders.refinement import SLACK

__all__ = ["Build", "real_build", "simulated_build", "step_documents", "weir_packed"]


@dataclass
class Build:
    """What the benchmark needs of a build: its sequences' segments (source, length), steps, cost model, the
    plan's tokens per step and source, its phases, and the loader's planners (default balance, window 1)."""

    name: str
    seq_len: int
    batch: int
    cost: CostModel
    seg_offsets: np.ndarray  # int64 [sequences + 1]
    seg_source: np.ndarray  # int64 [segments]
    seg_length: np.ndarray  # int64 [segments]
    planned: np.ndarray  # float64 [steps, sources]
    phase: np.ndarray  # int64 [steps]
    phase_names: list[str]
    sources: list[str]
    planner: Callable[[bool], StepPlanner]  # window1 → the loader's planner
    steps: int = field(init=False)

    def __post_init__(self) -> None:
        self.steps = (len(self.seg_offsets) - 1) // self.batch

    def documents(self, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The segments (lengths int64, owning position in ``seqs`` int64) of sequences ``seqs``, in order."""
        lo, hi = self.seg_offsets[seqs], self.seg_offsets[seqs + 1]
        idx = np.concatenate([np.arange(a, b) for a, b in zip(lo, hi, strict=True)]) if len(seqs) else np.zeros(0)
        owner = np.repeat(np.arange(len(seqs)), hi - lo)
        return self.seg_length[idx.astype(np.int64)], owner

    def compositions(self, stream: list[np.ndarray]) -> np.ndarray:
        """Tokens per source (int64 [steps, sources]) of each step of ``stream`` (sequence indices per step)."""
        owner = np.repeat(np.arange(len(self.seg_offsets) - 1), np.diff(self.seg_offsets))
        per_seq = np.zeros((len(self.seg_offsets) - 1, len(self.sources)), dtype=np.int64)
        np.add.at(per_seq, (owner, self.seg_source), self.seg_length)
        return np.array([per_seq[s].sum(axis=0) for s in stream])

    def unit(self) -> float:
        """Real tokens of the fullest sequence (``mixture_error``'s whole unit)."""
        return float(np.add.reduceat(self.seg_length, self.seg_offsets[:-1]).max())


def simulated_build(
    name: str, lens: dict[str, np.ndarray], seq_len: int, steps: int, seed: int, batch: int = 16, packer: str = "weir"
) -> Build:
    """A three-phase build (``benchmarks/curriculum.py``'s ``ramps`` curriculum) drawn from ``lens`` and packed by
    weir's packer (``packer="weir"``, :func:`weir_packed`: what a build hands the trainer) or best-fit decreasing
    as ``benchmarks/simulation.py`` does (``"bfd"``); balance ``regroup: {window: 20, period: 10, slack: 1.15}``,
    cost l² + 49152·l."""
    phases = curriculum(steps, "ramps")
    shares, caps, phase = planned_shares(phases)
    drawn = draw(lens, seq_len, batch, len(shares), seed, shares, caps)
    packed = weir_packed(drawn, shares, phase, seq_len, batch) if packer == "weir" else bfd(drawn, seq_len, batch)
    starts = [int(np.flatnonzero(phase == k)[0]) for k in range(len(phases))]
    shards = SimulatedShards(packed, batch, starts)

    def planner(window1: bool) -> StepPlanner:
        if window1:
            return StepPlanner(shards, window=1)  # type: ignore[arg-type]  # the metadata a ShardSet gives
        return StepPlanner(shards, window=20, period=10, slack=SLACK)  # type: ignore[arg-type]

    return Build(
        name, seq_len, batch, COST, shards.seg_offsets, shards.segments[:, 0].copy(), shards.segments[:, 3].copy(),
        shares * seq_len * batch, phase, [p[0] for p in phases], list(MIXTURE), planner,
    )  # fmt: skip


def weir_packed(
    drawn: list[list[tuple[int, int]]], shares: np.ndarray, phase: np.ndarray, seq_len: int, batch: int
) -> list[Step]:
    """The drawn units (per step, (source, length)) packed by weir's packer (:func:`mixing.pack.packing.
    pack_units`, its default engine) against the planned ``shares`` [steps, sources] per step, phases as
    ``phase`` [steps] numbers them: per step, per sequence its (source, length) segments."""
    from mixing.pack.packing import pack_units

    rows = [(n, k, 0, 0, t, 0) for t, units in enumerate(drawn) for k, n in units]
    units = np.array(rows, dtype=np.int64).reshape(-1, 6)
    units[:, 2] = np.arange(len(units))  # every unit its own document
    plan_steps = [(t, f"phase{int(p)}") for t, p in enumerate(phase)]
    p = pack_units(units, plan_steps, tuple(MIXTURE), seq_len, batch, COST, shares * seq_len * batch)
    seqs = [
        [(int(src), int(n)) for src, _doc, _start, n in p.segments[a:b]]
        for a, b in itertools.pairwise(p.seg_offsets.tolist())
    ]
    return [Step(seqs[t * batch : (t + 1) * batch]) for t in range(len(seqs) // batch)]


def real_build(path: str) -> Build:
    """A finished build folder: its shards, manifest (cost model, balance, phases) and plan quotas."""
    import duckdb

    from loaders.config import Balance
    from loaders.stream import stream_planner
    from mixing.output.layout import BuildLayout
    from mixing.plan.mixture import planned_tokens

    layout = BuildLayout.of(Path(path))
    shards = layout.shard_set()
    m = shards.manifest
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        quotas = con.sql("SELECT step, phase, source, quota FROM plan_quotas").pl()
    names, phase_names, phase, plan = planned_tokens(quotas)
    sources = list(m.sources or ())
    planned = np.zeros((len(plan), len(sources)))
    for k, s in enumerate(sources):
        planned[:, k] = plan[:, names.index(s)]
    offs, segs = shards.segments
    assert m.global_batch is not None

    def planner(window1: bool) -> StepPlanner:
        return stream_planner(shards, Balance(window=1) if window1 else Balance())

    return Build(
        str(path), int(m.seq_len), int(m.global_batch), m.cost, np.asarray(offs, dtype=np.int64),
        segs[:, 0].astype(np.int64), segs[:, 3].astype(np.int64), planned, phase, list(phase_names), sources, planner,
    )  # fmt: skip


def step_documents(build: Build, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Build step ``t``'s documents (lengths) and the position in the step of the sequence holding each."""
    return build.documents(np.arange(t * build.batch, (t + 1) * build.batch))
