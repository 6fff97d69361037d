"""The layouts ``benchmarks/hybrid.py`` compares, priced by one cost model, and the floors under them.

- :func:`price`: the one place a document is priced, compute + CP communication per rank of its block
  (``contract.cost.CostModel.time``); :func:`per_micro_batch` what every micro-batch costs every rank.
- :func:`step_floor` / :func:`floor_parts`: what no deal of one step's documents can beat.
- :func:`moved_tokens`: tokens whose attention needs K/V from another rank (weir's or Transformer Engine's
  zigzag); :func:`critical_path`: a step's predicted time from each rank's busy time per micro-batch.
- :class:`Figures`: one layout's figures over a run and their summary (the keys ``--json`` prints).
- :func:`fixed_layout` (the loader's planner, default balance or window 1), :func:`hybrid_layout`
  (``loaders.hybrid.deal``, checked by :func:`deal_problems`), :func:`megatron_layout` (Megatron-core's
  ``DefaultDynamicCPScheduler``, ``benchmarks/megatron_dcp.py``; :func:`schedule_busy` prices its schedule).

Times are in the cost model's units (float64); every figure but ``plan_s`` (wall time) is deterministic.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.hybrid_builds import Build, step_documents
from benchmarks.megatron_dcp import Schedule, check, traffic
from benchmarks.megatron_dcp import schedule as megatron_schedule
from contract.cost import CostModel
from mixing.plan.mixture import mixture_error

__all__ = [
    "Figures",
    "critical_path",
    "deal_problems",
    "fixed_layout",
    "floor_parts",
    "hybrid_layout",
    "megatron_layout",
    "moved_tokens",
    "per_micro_batch",
    "price",
    "schedule_busy",
    "step_floor",
]


def price(cost: CostModel, lengths: np.ndarray, degree: np.ndarray, gpus_per_node: int) -> np.ndarray:
    """Predicted time (cost units) each rank of a document's block spends on it: compute + CP communication,
    float64 [n] for documents of ``lengths`` tokens trained on blocks of ``degree`` ranks (1: no CP), blocks
    aligned to their size (a block of at most ``gpus_per_node`` ranks stays inside a node). The one place the
    benchmark prices a document: ``contract.cost.CostModel.time``, as the deal does."""
    lengths = np.asarray(lengths, dtype=np.int64)
    degree = np.asarray(degree, dtype=np.int64)
    return np.asarray(cost.time(lengths, degree, gpus_per_node), dtype=np.float64).reshape(-1)


def per_micro_batch(cost: CostModel) -> float:
    """What every micro-batch costs every rank whatever it holds (``CostModel.per_micro_batch``)."""
    return float(cost.per_micro_batch)


def step_floor(lengths: np.ndarray, world: int, capacity: int, cost: CostModel, gpus_per_node: int) -> float:
    """A floor under the predicted time of any deal of one step's documents (no token moving between steps) on
    ``world`` ranks of ``capacity`` tokens: the busiest rank spends at least the least per-rank time of any
    document (over the degrees its length allows, up to the largest aligned block), and at least the mean of
    the least total work (degree × per-rank time) of all documents; every rank runs at least the micro-batches
    the step's tokens need (:func:`floor_parts`)."""
    document, work, micro = floor_parts(lengths, world, capacity, cost, gpus_per_node)
    return max(document, work) + micro


def floor_parts(
    lengths: np.ndarray, world: int, capacity: int, cost: CostModel, gpus_per_node: int
) -> tuple[float, float, float]:
    """:func:`step_floor`'s terms: (the heaviest document's least per-rank time, the least total work's mean over
    the ranks, the micro-batches' cost). Where the first is the larger, one document alone sets the step's time
    and no deal can even the ranks out: the goal is then the busiest rank within 2 % of the floor."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not len(lengths):
        return 0.0, 0.0, 0.0
    top = 1 << (world.bit_length() - 1)
    degree = 1 << np.ceil(np.log2(-(-lengths // capacity))).astype(np.int64)
    per_rank = np.full(len(lengths), np.inf)
    total = np.full(len(lengths), np.inf)
    while (degree <= top).any():
        ok = degree <= top
        tau = price(cost, lengths, np.minimum(degree, top), gpus_per_node)
        per_rank = np.where(ok, np.minimum(per_rank, tau), per_rank)
        total = np.where(ok, np.minimum(total, degree * tau), total)
        degree = degree * 2
    micro = -(-int(lengths.sum()) // (world * capacity))
    return float(per_rank.max()), float(total.sum()) / world, micro * per_micro_batch(cost)


def moved_tokens(lengths: np.ndarray, degree: np.ndarray, front_padding: bool = True) -> int:
    """Tokens whose attention needs K/V from another rank: of a document zigzagged over ``d > 1`` ranks in
    ``2d`` chunks, every real token but those of its first chunk, whose keys lie in that chunk, on the query's
    own rank. ``front_padding``: weir's split (``loaders.context_parallel.document_zigzag``, padding before
    the document); else Transformer Engine's THD split (padding after it), which Megatron uses."""
    lengths = np.asarray(lengths, dtype=np.int64)
    degree = np.asarray(degree, dtype=np.int64)
    two = 2 * degree
    m = -(-lengths // two)
    first = np.maximum(0, m - (two * m - lengths)) if front_padding else np.minimum(m, lengths)
    return int(np.where(degree > 1, lengths - first, 0).sum())


def critical_path(busy: np.ndarray, blocks: list[list[tuple[int, int]]]) -> float:
    """A step's predicted time: ``busy`` float64 [micro-batches, world] each rank's time in each micro-batch,
    ``blocks`` per micro-batch the (first rank, size) of the runs of ranks that train a document together; each
    rank runs its micro-batches in order, and the ranks of overlapping blocks start a micro-batch together."""
    world = busy.shape[1]
    finish = np.zeros(world)
    for k in range(busy.shape[0]):
        merged: list[list[int]] = []
        for a, s in sorted(b for b in blocks[k] if b[1] > 1):
            if merged and a < merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], a + s)
            else:
                merged.append([a, a + s])
        for a, b in merged:
            finish[a:b] = finish[a:b].max()
        finish += busy[k]
    return float(finish.max())


@dataclass
class Figures:
    """One layout's figures over a run (fixed, fixed_window1, hybrid or megatron), as ``--json`` prints them."""

    step_time: list[float] = field(default_factory=list)
    imbalance: list[float] = field(default_factory=list)
    busiest: list[float] = field(default_factory=list)  # per step: the busiest rank's predicted time
    moved: list[int] = field(default_factory=list)
    schedule_bytes: list[int] = field(default_factory=list)
    allgather_bytes: list[int] = field(default_factory=list)  # Megatron's rerouting by all-gather (dev head)
    collectives: list[int] = field(default_factory=list)
    micro_batches: list[int] = field(default_factory=list)
    plan_s: float = 0.0
    stream: list[np.ndarray] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def add(
        self, busy: np.ndarray, blocks: list[list[tuple[int, int]]], moved: int, nbytes: int = 0, calls: int = 0
    ) -> None:
        """Record one step: per micro-batch each rank's busy time and the blocks that start together."""
        per_rank = busy.sum(axis=0)
        self.step_time.append(critical_path(busy, blocks))
        self.imbalance.append(float(per_rank.max() / per_rank.mean()) if per_rank.mean() > 0 else 1.0)
        self.busiest.append(float(per_rank.max()))
        self.moved.append(moved)
        self.schedule_bytes.append(nbytes)
        self.collectives.append(calls)
        self.micro_batches.append(busy.shape[0])

    def summary(self, base: float, build: Build, floors: list[tuple[float, float, float]] | None) -> dict[str, Any]:
        """The printed keys; ``base``: the fixed default's total predicted time; ``floors``: each build step's
        :func:`floor_parts`, None for a layout whose steps are not the build's. Where they are given, the steps
        one document bounds are apart: ``compute_imbalance_even_*`` over the other steps, and the busiest rank
        over the floor (``one_document_over_floor_*``) over those."""
        realized = build.compositions(self.stream)
        me = mixture_error(realized, build.planned, build.phase, build.sources, build.phase_names, unit=build.unit())
        one = np.array([d > w for d, w, _m in floors], dtype=bool) if floors is not None else None
        floor = sum(max(d, w) + m for d, w, m in floors) if floors is not None else None
        imbalance = np.asarray(self.imbalance)
        even = imbalance[~one] if one is not None and (~one).any() else imbalance
        over = (
            np.array([b / (max(d, w) + m) for b, (d, w, m), o in zip(self.busiest, floors, one, strict=True) if o])
            if floors is not None and one is not None
            else np.zeros(0)
        )
        return {
            "step_time_ratio": round(sum(self.step_time) / base, 4),
            "time_over_floor": None if floor is None else round(sum(self.step_time) / floor, 4),
            "compute_imbalance_mean": round(float(np.mean(imbalance)), 4),
            "compute_imbalance_p95": round(float(np.percentile(imbalance, 95)), 4),
            "one_document_steps": None if one is None else int(one.sum()),
            "compute_imbalance_even_mean": None if one is None else round(float(np.mean(even)), 4),
            "compute_imbalance_even_p95": None if one is None else round(float(np.percentile(even, 95)), 4),
            "one_document_over_floor_p95": round(float(np.percentile(over, 95)), 4) if len(over) else None,
            "one_document_over_floor_max": round(float(over.max()), 4) if len(over) else None,
            "cp_tokens_moved": round(float(np.mean(self.moved))),
            "schedule_bytes": round(float(np.mean(self.schedule_bytes))),
            "schedule_bytes_allgather": round(float(np.mean(self.allgather_bytes))) if self.allgather_bytes else 0,
            "collectives": round(float(np.mean(self.collectives))),
            "stream_mixture_window": round(me.window, 4),
            "stream_mixture_phase": round(me.phase, 4),
            "plan_ms_per_step": round(1000 * self.plan_s / len(self.step_time), 2),
            "micro_batches_mean": round(float(np.mean(self.micro_batches)), 2),
            "problems": self.problems[:5],
        }


def fixed_layout(build: Build, window1: bool, dp: int, cp: int, gpus_per_node: int) -> Figures:
    """Today's layout: the loader's planner deals whole sequences to DP ranks; each goes over all ``cp``
    ranks of its DP rank, one sequence per micro-batch."""
    fig = Figures()
    t0 = time.perf_counter()
    planner = build.planner(window1)
    per_step = [planner.assignment(t, dp) for t in range(build.steps)]
    fig.plan_s = time.perf_counter() - t0
    fig.stream = [planner.step_sequences(t) for t in range(build.steps)]
    for ranks in per_step:
        n_mb = max(len(r) for r in ranks)
        busy = np.zeros((n_mb, dp * cp))
        moved = 0
        for d, seqs in enumerate(ranks):
            for k, s in enumerate(seqs):
                lengths, _ = build.documents(np.array([s]))
                degree = np.full(len(lengths), cp)
                busy[k, d * cp : (d + 1) * cp] = price(build.cost, lengths, degree, gpus_per_node).sum()
                moved += moved_tokens(lengths, degree)
        busy += per_micro_batch(build.cost)
        blocks = [[(d * cp, cp) for d in range(dp)]] * n_mb
        fig.add(busy, blocks, moved)
    return fig


def hybrid_layout(
    build: Build, dp: int, cp: int, gpus_per_node: int, capacity: int, stream: list[np.ndarray] | None = None
) -> Figures:
    """weir's hybrid layout: ``loaders.hybrid.deal`` over each build step's documents, or over each step of
    ``stream`` (sequence indices per step: another layout's steps, such as the fixed default's regrouped ones)."""
    from loaders.hybrid import HybridWorld, deal

    fig = Figures()
    world = HybridWorld(dp=dp, cp=cp, capacity=capacity, gpus_per_node=gpus_per_node)
    fig.stream = stream or [np.arange(t * build.batch, (t + 1) * build.batch) for t in range(build.steps)]
    worst = 0.0
    if build.steps:  # the compiled kernels' load (or compile) is the process's, once, not a step's
        deal(build.documents(fig.stream[0])[0], world, build.cost)
    for t in range(build.steps):
        lengths, _ = build.documents(fig.stream[t])
        t0 = time.perf_counter()
        d = deal(lengths, world, build.cost, seed=t)
        fig.plan_s += time.perf_counter() - t0
        degree, first, mb = (np.asarray(x, dtype=np.int64) for x in (d.degree, d.first_rank, d.micro_batch))
        fig.problems += [f"step {t}: {p}" for p in deal_problems(lengths, degree, first, mb, dp * cp, capacity)]
        tau = price(build.cost, lengths, degree, gpus_per_node)
        busy = np.zeros((int(d.micro_batches), dp * cp))
        rank = np.repeat(first, degree) + (np.arange(int(degree.sum())) - np.repeat(np.cumsum(degree) - degree, degree))
        np.add.at(busy, (np.repeat(mb, degree), rank), np.repeat(tau, degree))
        busy += per_micro_batch(build.cost)
        blocks: list[list[tuple[int, int]]] = [[] for _ in range(busy.shape[0])]
        for i in np.flatnonzero(degree > 1):
            blocks[mb[i]].append((int(first[i]), int(degree[i])))
        fig.add(busy, blocks, moved_tokens(lengths, degree))
        rt = np.asarray(d.rank_time, dtype=np.float64)
        if rt.max() > 0:
            worst = max(worst, float(np.abs(rt - busy.sum(axis=0)).max() / rt.max()))
    if worst > 1e-6:
        fig.problems.append(f"deal.rank_time differs from this benchmark's pricing by up to {worst:.2%}")
    return fig


def deal_problems(
    lengths: np.ndarray, degree: np.ndarray, first: np.ndarray, mb: np.ndarray, world: int, capacity: int
) -> list[str]:
    """What breaks the hybrid layout's rules: every document on an aligned power-of-two block inside the world,
    at most ``capacity`` tokens on a rank in a micro-batch."""
    out = []
    if len(degree) != len(lengths):
        return [f"{len(degree)} degrees for {len(lengths)} documents"]
    if ((degree < 1) | (degree & (degree - 1)) | (first % np.maximum(degree, 1)) | (first + degree > world)).any():
        out.append("a block that is not an aligned power of two inside the world")
    load = np.zeros((int(mb.max()) + 1 if len(mb) else 1, world))
    rank = np.repeat(first, degree) + (np.arange(int(degree.sum())) - np.repeat(np.cumsum(degree) - degree, degree))
    np.add.at(load, (np.repeat(mb, degree), rank), np.repeat(-(-lengths // degree), degree))
    if load.max() > capacity:
        out.append(f"a rank holds {int(load.max())} tokens in a micro-batch, over its capacity {capacity}")
    return out


def megatron_layout(build: Build, dp: int, cp: int, gpus_per_node: int, capacity: int) -> Figures:
    """Megatron-core's ``DefaultDynamicCPScheduler`` over each build step's documents."""
    fig = Figures()
    fig.stream = [np.arange(t * build.batch, (t + 1) * build.batch) for t in range(build.steps)]
    for t in range(build.steps):
        lengths, pos = step_documents(build, t)
        t0 = time.perf_counter()
        s = megatron_schedule(lengths, dp, cp, capacity)
        fig.plan_s += time.perf_counter() - t0
        fig.problems += [f"step {t}: {p}" for p in check(s, len(lengths))]
        owner = pos * dp // build.batch  # each DP rank loads a contiguous share of the global batch
        tr = traffic(lengths, owner, s, dp, cp)
        busy, blocks, moved = schedule_busy(s, lengths, build.cost, gpus_per_node)
        fig.add(busy, blocks, moved, tr.bytes_alltoall, tr.collectives)
        fig.allgather_bytes.append(tr.bytes_allgather)
    return fig


def schedule_busy(
    s: Schedule, lengths: np.ndarray, cost: CostModel, gpus_per_node: int
) -> tuple[np.ndarray, list[list[tuple[int, int]]], int]:
    """Per micro-batch each rank's time, the blocks, and the tokens moved, of a Megatron schedule."""
    busy = np.zeros((len(s.micro_batches), s.world))
    blocks: list[list[tuple[int, int]]] = []
    moved = 0
    for k in range(len(s.micro_batches)):
        row = []
        for b in s.blocks(k):
            docs = np.array(b.docs, dtype=np.int64)
            degree = np.full(len(docs), b.size)
            busy[k, b.first : b.first + b.size] = price(cost, lengths[docs], degree, gpus_per_node).sum()
            moved += moved_tokens(lengths[docs], degree, front_padding=False)
            row.append((b.first, b.size))
        blocks.append(row)
    return busy + per_micro_batch(cost), blocks, moved
