"""Hybrid data parallelism, predicted: the time of every step of a build under three layouts, one cost model.

- ``fixed``: today's layout. The loader's planner (``loaders.planner.StepPlanner``, the build's balance:
  ``regroup`` window 20, period 10, slack 1.15 on the simulated builds) gives each DP rank its sequences of a
  training step; each sequence goes whole to one DP rank and is split over all ``cp`` ranks with weir's
  per-document zigzag: every rank computes ``cost / cp`` of each document, and every document pays CP
  communication at degree ``cp``. ``fixed_window1`` is the same with ``Balance(window=1)`` (the build's steps).
- ``hybrid``: ``loaders.hybrid.deal`` over each build step's documents (the build's segments of that step, the
  S-token pieces of long documents included), on a world of ``dp × cp`` ranks whose capacity is what a rank
  holds under the fixed layout, ``S / cp`` tokens. Nothing moves between steps: the trainer's stream is the
  build's steps. It is dealt offline, so it needs no collective and moves no byte to make the schedule.
- ``hybrid_regrouped``: the same deal over the steps the fixed default's regroup makes (sequences moved between
  steps): what moving them would add to the hybrid layout, and what it costs the stream's mixture. Not a
  layout weir offers; the measure of what the build's own steps leave on the table.
- ``megatron``: Megatron-core's ``DefaultDynamicCPScheduler`` (``benchmarks/megatron_dcp.py``) over the same
  documents with ``max_seqlen_per_dp_cp_rank`` = that capacity; every DP rank loads its contiguous share of the
  step (``global_batch / dp`` sequences, unpacked into documents), and the scheduler's all-gather of lengths
  and per-field all-to-all are counted (collectives per step, bytes per step over all ranks; also the bytes of
  the per-field all-gather Megatron's ``dev`` branch now reroutes with). They are counted, not priced: its
  predicted time leaves out the rerouting and the scheduling itself, so it is a floor under Megatron's.

A step's predicted time is its critical path: each rank runs its micro-batches in order; the ranks that train
one document together (a CP block) start it together; the gradient reduction that ends every step is the same
under every layout and left out. Per document and rank of its block, time = compute + CP communication
(:func:`benchmarks.hybrid_layouts.price`: ``contract.cost.CostModel``'s communication terms where it has
them). Printed per layout: ``step_time_ratio`` (total predicted time ÷ the fixed default's), ``time_over_floor``
(total predicted time ÷ the total of :func:`benchmarks.hybrid_layouts.step_floor`, what no deal of the build's
steps can beat; none for the fixed default, whose steps are regrouped), ``compute_imbalance`` mean and p95 (per step,
max ÷ mean over all ranks of predicted busy time, compute + communication; for layouts that keep the build's
steps also apart: ``one_document_steps``, the steps whose floor one document sets, no deal being able to even
them, ``compute_imbalance_even_*`` over the other steps, and ``one_document_over_floor_p95`` / ``_max``, the
busiest rank over the floor on those), ``cp_tokens_moved`` (per step:
tokens whose attention needs K/V from another rank: under zigzag all of a split document but its first
chunk), ``schedule_bytes`` and ``collectives`` (per step), ``stream_mixture_window`` / ``stream_mixture_phase``
(``mixture_error`` of what the trainer receives against the plan's ramped shares: worst 10-step window,
worst phase), ``plan_ms_per_step`` (one core: the planner, the deal on its default engine, the scheduler;
``benchmarks/hybrid_plan.py`` times the deal alone at 1 M tokens per step) and the micro-batches per step (free
at the cost model's ``per_micro_batch`` 0, the default).

Regimes (default): three-phase curricula (``benchmarks/curriculum.py``'s ``ramps``: warmup, main, anneal, with
ramps) drawn and packed as ``benchmarks/simulation.py`` does, global batch 16: real lengths from
``../shared/data`` (skipped, saying so, without it) at S=32768 on dp 16 × cp 4 and at S=131072 on dp 8 × cp 8,
and a synthetic long-tailed length distribution at both. ``--build BUILD --dp D --cp C`` reads a real build
instead (its manifest's cost model, balance and phases; its plan's quotas). ``--quick``: 30 steps, for a smoke
run. ``--cost FIELD=VALUE`` overrides a number of the cost model (a sensitivity run). ``--validate``: the
simulator against a published result it can be fed (verl's dynamic CP, see :func:`validate`).

    TIKTOKEN_CACHE_DIR=../shared/tokenizers/tiktoken_cache .venv/bin/python benchmarks/hybrid.py [--json]
    .venv/bin/python benchmarks/hybrid.py --build build/demo --dp 4 --cp 2 --json
    .venv/bin/python benchmarks/hybrid.py --validate

This script holds the CLI, the regimes, the goals and the printing; the builds (simulated and real) are
``benchmarks/hybrid_builds.py``'s, the layouts, their pricing and the floors ``benchmarks/hybrid_layouts.py``'s.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages: run as a script, only this folder is on the path

import argparse
import hashlib
import json
import os
import subprocess
import time
from dataclasses import replace
from typing import Any

import numpy as np

from benchmarks.hybrid_builds import Build, real_build, simulated_build, step_documents
from benchmarks.hybrid_layouts import (
    Figures,
    critical_path,
    fixed_layout,
    floor_parts,
    hybrid_layout,
    megatron_layout,
    schedule_busy,
)
from benchmarks.megatron_dcp import check, dp_balanced
from benchmarks.megatron_dcp import schedule as megatron_schedule
from benchmarks.simulation import SHARED, lengths
from contract.cost import CostModel
from mixing.plan.mixture import GOAL_PHASE, GOAL_WINDOW

# benchmarks/hybrid_plan.py imports simulated_build and step_documents from here, with the script's helpers
__all__ = [
    "COLUMNS",
    "GPUS_PER_NODE",
    "commit",
    "goals",
    "load_average",
    "long_tailed",
    "main",
    "overridden",
    "real_data_here",
    "run_regime",
    "simulated_build",
    "step_documents",
    "uncommitted",
    "validate",
]

GPUS_PER_NODE = 8
COLUMNS = {  # the printed table's columns: key → header
    "step_time_ratio": "time ratio",
    "time_over_floor": "over floor",
    "compute_imbalance_mean": "imb mean",
    "compute_imbalance_p95": "imb p95",
    "one_document_steps": "1-doc steps",
    "compute_imbalance_even_mean": "even mean",
    "compute_imbalance_even_p95": "even p95",
    "one_document_over_floor_max": "1-doc/floor",
    "cp_tokens_moved": "cp moved",
    "schedule_bytes": "sched bytes",
    "collectives": "collectives",
    "stream_mixture_window": "mix/10",
    "stream_mixture_phase": "mix/phase",
    "plan_ms_per_step": "plan ms",
    "micro_batches_mean": "micro-b.",
}


def overridden(cost: CostModel, overrides: dict[str, Any]) -> CostModel:
    """``cost`` with the numbers of ``overrides`` (field → value) in place of its own (``--cost``)."""
    return replace(cost, **overrides)


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def commit() -> str:
    """The checkout's short commit, for the printed header."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        return head.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def uncommitted() -> dict[str, str]:
    """The files whose code makes the figures and that differ from the commit, each with the first 12 hex
    digits of its sha256 (the header names them: the commit alone would not say which code ran)."""
    names = [f"benchmarks/hybrid{part}.py" for part in ("", "_builds", "_layouts")]
    names += ["benchmarks/megatron_dcp.py", "contract/cost.py"]
    names += [f"loaders/hybrid{part}.py" for part in ("", "_placement", "_fill", "_kernels")]
    try:
        out = subprocess.run(["git", "status", "--porcelain", *names], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return {}
    changed = [line[3:] for line in out.stdout.splitlines()]
    return {n: hashlib.sha256((ROOT / n).read_bytes()).hexdigest()[:12] for n in changed if (ROOT / n).exists()}


def run_regime(build: Build, dp: int, cp: int, gpus_per_node: int, capacity: int, as_json: bool) -> dict[str, dict]:
    """Every layout over ``build``; prints a table (or one JSON object per layout) and returns the figures."""
    t0 = time.perf_counter()
    figs: dict[str, Figures] = {
        "fixed": fixed_layout(build, False, dp, cp, gpus_per_node),
        "fixed_window1": fixed_layout(build, True, dp, cp, gpus_per_node),
    }
    try:
        figs["hybrid"] = hybrid_layout(build, dp, cp, gpus_per_node, capacity)
        # the same deal over the steps the fixed default's regroup makes: what moving sequences between steps
        # would add to it, and what it costs the stream's mixture
        regrouped = hybrid_layout(build, dp, cp, gpus_per_node, capacity, stream=figs["fixed"].stream)
    except ImportError as e:  # loaders/hybrid.py not there yet
        print(f"hybrid layout skipped: {e}", file=sys.stderr)
    figs["megatron"] = megatron_layout(build, dp, cp, gpus_per_node, capacity)
    if "hybrid" in figs:
        figs["hybrid_regrouped"] = regrouped
    base = sum(figs["fixed"].step_time)
    floors = [
        floor_parts(step_documents(build, t)[0], dp * cp, capacity, build.cost, gpus_per_node)
        for t in range(build.steps)
    ]
    out = {
        name: f.summary(base, build, None if name in ("fixed", "hybrid_regrouped") else floors)
        for name, f in figs.items()
    }
    head = {"regime": build.name, "S": build.seq_len, "global_batch": build.batch, "dp": dp, "cp": cp}
    head |= {"capacity": capacity, "steps": build.steps, "seconds": round(time.perf_counter() - t0, 1)}
    if as_json:
        for name, row in out.items():
            print(json.dumps({**head, "layout": name, **row, "load_average": load_average()}))
    else:
        print(f"\n{head}  load average {load_average()}")
        print(f"{'':14}" + " ".join(f"{c:>11}" for c in COLUMNS.values()))
        for name, row in out.items():
            print(f"{name:14}" + " ".join(f"{'-' if row[c] is None else row[c]:>11}" for c in COLUMNS))
            for p in row["problems"]:
                print(f"{'':14}problem: {p}")
    goals(out, build, as_json)
    return out


def goals(out: dict[str, dict], build: Build, as_json: bool) -> None:
    """The hybrid layout's goals, met or missed, on this regime."""
    h = out.get("hybrid")
    if h is None:
        return
    stream = h["stream_mixture_window"] <= GOAL_WINDOW and h["stream_mixture_phase"] <= GOAL_PHASE
    # where one document alone sets a step's time no deal evens it out: the goal there is that bound within 2 %
    even = h["compute_imbalance_even_mean"] <= 1.05 and h["compute_imbalance_even_p95"] <= 1.10
    bound = h["one_document_over_floor_max"] is None or h["one_document_over_floor_max"] <= 1.02
    fixed = min(out["fixed"]["step_time_ratio"], out["fixed_window1"]["step_time_ratio"])
    lines = {
        f"stream ≤ {GOAL_WINDOW} per window, ≤ {GOAL_PHASE} per phase": stream,
        "compute_imbalance ≤ 1.05 mean, ≤ 1.10 p95 (steps the work bounds)": even,
        "within 2 % of the bound (steps one document bounds)": bound,
        "step time ≤ fixed (default and window 1)": h["step_time_ratio"] <= fixed,
        "step time ≤ Megatron's": h["step_time_ratio"] <= out["megatron"]["step_time_ratio"],
        "0 collectives, 0 schedule bytes": h["collectives"] == 0 and h["schedule_bytes"] == 0,
    }
    if "longtail" in build.name and build.seq_len == 131072:
        lines["≥ 1.2× faster than fixed"] = h["step_time_ratio"] <= 1 / 1.2
    for text, ok in lines.items():
        line = {"regime": build.name, "goal": text, "met": bool(ok)} if as_json else None
        print(json.dumps(line) if as_json else f"  goal {text}: {'met' if ok else 'MISSED'}")


def long_tailed(seed: int = 0) -> dict[str, np.ndarray]:
    """Synthetic per-source lengths with long tails (truncated Pareto: many short documents, a few very long),
    in place of the real sources' (the same names, so the curriculum's mixtures apply)."""
    rng = np.random.default_rng(seed)

    def pareto(n: int, lo: int, hi: int, alpha: float) -> np.ndarray:
        u = rng.random(n)  # inverse CDF of a Pareto(alpha) truncated to [lo, hi]
        x = lo / (1 - u * (1 - (lo / hi) ** alpha)) ** (1 / alpha)
        return np.minimum(hi, x).astype(np.int64)

    return {
        "books": pareto(4000, 2048, 1 << 20, 1.1),
        "math": pareto(20000, 128, 8192, 1.5),
        "chat": pareto(20000, 256, 65536, 1.2),
        "multilingual": pareto(8000, 512, 131072, 1.1),
        "drama": pareto(20000, 64, 4096, 1.8),
    }


def validate(gpus_per_node: int, as_json: bool, overrides: dict[str, Any] | None = None) -> None:
    """Reproduce the direction of a published result: verl's dynamic CP (Megatron-core's scheduler) against a
    fixed CP 4, Qwen3-30B-A3B SFT, ``max_seqlen_per_dp_cp_rank`` 4096, long-tailed documents of 1K–16K tokens:
    209.97K → 337.16K tokens/s, 1.61× (verl-project/verl pull request 6555, "add dynamic context parallel
    scheduling"). Fed here: one node of 8 GPUs as dp 2 × cp 4, global batches of 256K tokens of truncated-Pareto
    lengths in [1024, 16384]; the fixed side is Megatron's own ``DpBalancedScheduler`` (documents packed in order
    into 16K sequences); the cost model is ``contract.cost``'s defaults (FlexSP's fitted 7B model: a cost unit is
    its attention per query-key pair, its measured bandwidths) scaled to the model's shape: 48 layers of 32 query
    heads of 128 (attention 1.5× the 7B's), 3.3 G active weights (linear ≈ half the 7B's 35,873), 4 K/V heads
    (192 KiB of K/V and gradients per token instead of 1 MiB)."""
    rng = np.random.default_rng(0)
    cost = overridden(CostModel(attention=1.5, linear=18200.0, comm_bytes=float(192 << 10)), overrides or {})
    dp, cp, m = 2, 4, 4096
    fixed_t = dyn_t = 0.0
    for _ in range(20):
        docs: list[int] = []
        while sum(docs) < 262144:
            u = rng.random()
            docs.append(int(1024 / (1 - u * (1 - (1024 / 16384) ** 1.2)) ** (1 / 1.2)))
        arr = np.array(docs, dtype=np.int64)
        for sched, acc in ((dp_balanced(arr, dp, cp, m), "fixed"), (megatron_schedule(arr, dp, cp, m), "dynamic")):
            problems = check(sched, len(arr))
            if problems:
                raise AssertionError(f"{acc}: {problems[:3]}")
            busy, blocks, _ = schedule_busy(sched, arr, cost, gpus_per_node)
            if acc == "fixed":
                fixed_t += critical_path(busy, blocks)
            else:
                dyn_t += critical_path(busy, blocks)
    published, simulated = 337.16 / 209.97, fixed_t / dyn_t
    row = {"validate": "verl dynamic CP vs fixed CP4, 1K-16K documents", "published_speedup": round(published, 3)}
    row |= {"simulated_speedup": round(simulated, 3), "same_direction": bool(simulated > 1.0)}
    print(json.dumps(row) if as_json else "  ".join(f"{k}: {v}" for k, v in row.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", help="a finished build folder (else: the simulated regimes)")
    ap.add_argument("--dp", type=int, help="DP size (with --build)")
    ap.add_argument("--cp", type=int, help="CP size (with --build)")
    ap.add_argument("--capacity", type=int, help="tokens a rank holds per micro-batch (default S / cp)")
    ap.add_argument("--gpus-per-node", type=int, default=GPUS_PER_NODE)
    ap.add_argument("--steps", type=int, default=200, help="steps of each simulated build")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=("real", "longtail"), help="run only these simulated regimes")
    ap.add_argument("--seq-len", type=int, choices=(32768, 131072), help="run only at this S")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 30 steps")
    ap.add_argument(
        "--packer", choices=("weir", "bfd"), default="weir",
        help="what packs the simulated builds: weir's packer (default) or plain best-fit decreasing",
    )  # fmt: skip
    ap.add_argument("--validate", action="store_true", help="against a published result, then exit")
    ap.add_argument("--json", action="store_true", help="one JSON object per layout")
    ap.add_argument(
        "--cost", action="append", default=[], metavar="FIELD=VALUE",
        help="override a number of the cost model (a sensitivity run), e.g. linear=0 or group_latency=0.002",
    )  # fmt: skip
    args = ap.parse_args()
    if args.steps < 30:
        ap.error(f"--steps {args.steps}: a simulated three-phase build takes at least 30 steps")
    overrides: dict[str, Any] = {k: float(v) for k, _, v in (c.partition("=") for c in args.cost)}
    start = {
        "commit": commit(),
        "uncommitted": uncommitted(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    print(json.dumps(start | {"load_average": load_average()}) if args.json else f"{start} load {load_average()}")
    if args.validate:
        validate(args.gpus_per_node, args.json, overrides)
        return
    if args.build:
        if not (args.dp and args.cp):
            ap.error("--build needs --dp and --cp")
        build = real_build(args.build)
        build.cost = overridden(build.cost, overrides)
        run_regime(build, args.dp, args.cp, args.gpus_per_node, args.capacity or build.seq_len // args.cp, args.json)
        return
    steps = 30 if args.quick else args.steps
    shapes = [(32768, 16, 4), (131072, 8, 8)]
    shapes = [s for s in shapes if args.seq_len in (None, s[0])]
    if args.only in (None, "real"):
        if real_data_here():
            lens = lengths((SHARED or ROOT) / "data")
            for s, dp, cp in shapes:
                build = simulated_build(f"real S={s}", lens, s, steps, args.seed, packer=args.packer)
                build.cost = overridden(build.cost, overrides)
                run_regime(build, dp, cp, args.gpus_per_node, args.capacity or s // cp, args.json)
        else:
            print("real-data regimes skipped: ../shared/data is not here (nor the cached lengths)")
    if args.only in (None, "longtail"):
        for s, dp, cp in shapes:
            build = simulated_build(f"longtail S={s}", long_tailed(args.seed), s, steps, args.seed, packer=args.packer)
            build.cost = overridden(build.cost, overrides)
            run_regime(build, dp, cp, args.gpus_per_node, args.capacity or s // cp, args.json)


def real_data_here() -> bool:
    """Whether the real sources' lengths can be had (``../shared/data``, or their cached lengths)."""
    return SHARED is not None or (ROOT / "build" / "bench" / "lengths-o200k.npz").exists()


if __name__ == "__main__":
    main()
