"""The trainer's mixture across a curriculum at one sequence per rank: weir's layouts beside the build's steps.

Three phases at S = 32768 and 131072, global batch 16, dp 16, on the real lengths of ``benchmarks/simulation.py``
(the same sources, draw, BFD packing and cost model): a warmup of short documents (``max_doc_tokens`` 4096,
10 %), the main mixture (75 %), an anneal with fewer books (15 %); kinds ``same`` (one mixture in every phase),
``noramp`` (three mixtures of unequal cost) and ``ramps`` (the same with a 3-step linear ramp into main and a
3-step cosine ramp into the anneal: the real curriculum). Rows: the build's steps (B3, regroup off), weir's
default (each phase's template order matched to the phase before it, ``loaders.order``; no edges), the
heaviest-first layout (``layout=0``), and weir with edges over each of ``--edge-windows`` windows after a
boundary that needs them (the balance/mixture trade-off; ``--edge-goal`` moves it too).

Prints ``dp_imbalance`` mean / p95 over steps and ``mixture_error`` of the trainer's stream against the plan's
ramped per-step shares: the worst 10-step window (and how many of them miss 0.01), the worst window among those
that cross no phase boundary (``inside``), and the worst phase; and the planner's time per step (one core, beside
the printed load average: what the DataLoader's workers spend laying the steps out).

    TIKTOKEN_CACHE_DIR=../shared/tokenizers/tiktoken_cache .venv/bin/python benchmarks/curriculum.py \\
        [--kind ramps] [--seq-len 32768] [--edge-windows 1 2 4 1000]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages: run as a script, only this folder is on the path


import time

import numpy as np

from benchmarks.simulation import (
    MIXTURE,
    SimulatedShards,
    bfd,
    cost,
    draw,
    real_lengths,
    regrouped_steps,
    run_arguments,
    source_tokens,
)
from loaders import refinement
from loaders.balance import assign_ranks, dp_imbalance
from loaders.planner import EDGE_WINDOWS, LAYOUT
from mixing.plan.curriculum import ramp
from mixing.plan.mixture import mixture_error as phase_error
from mixing.plan.mixture import window_errors

WARMUP = {"math": 0.3, "chat": 0.3, "multilingual": 0.1, "drama": 0.3}  # short documents, under a length cap
ANNEAL = {"books": 0.2, "math": 0.35, "chat": 0.15, "multilingual": 0.15, "drama": 0.15}
Phase = tuple[str, int, dict[str, float], int, str, int | None]  # name, steps, mixture, ramp, shape, cap


def curriculum(steps: int, kind: str) -> list[Phase]:
    """A run of about ``steps`` steps in three phases (whole blocks of 10): warmup (10 %, documents ≤ 4096
    tokens), main (75 %), anneal (15 %). ``kind``: ``same`` (one mixture, no cap, no ramps), ``noramp``
    (three mixtures of unequal cost), ``ramps`` (the same with a 3-step linear ramp into main and a
    3-step cosine ramp into the anneal: the real curriculum). ValueError under 30 steps (a block each)."""
    if steps < 30:
        raise ValueError(f"a three-phase curriculum takes at least 30 steps (10 per phase), not {steps}")
    warm, anneal = max(10, round(steps * 0.1 / 10) * 10), max(10, round(steps * 0.15 / 10) * 10)
    main = steps - warm - anneal
    if kind == "same":
        return [("warmup", warm, MIXTURE, 0, "step", None), ("main", main, MIXTURE, 0, "step", None),
                ("anneal", anneal, MIXTURE, 0, "step", None)]  # fmt: skip
    r = 3 if kind == "ramps" else 0
    return [("warmup", warm, WARMUP, 0, "step", 4096), ("main", main, MIXTURE, r, "linear", None),
            ("anneal", anneal, ANNEAL, r, "cosine", None)]  # fmt: skip


def planned_shares(phases: list[Phase]) -> tuple[np.ndarray, list[int | None], np.ndarray]:
    """Per step: the planned share of each source (ramps as ``mixing.plan.curriculum.planner``), the length cap
    and the phase index."""
    rows, caps, idx, prev = [], [], [], None
    for k, (_, n, mix, ramp_steps, shape, cap) in enumerate(phases):
        target = np.array([mix.get(s, 0.0) for s in MIXTURE])
        block = np.tile(target, (n, 1))
        if prev is not None and ramp_steps:
            a = ramp(shape, ramp_steps)[:, None]
            block[:ramp_steps] = (1 - a) * prev + a * target
        rows.append(block)
        caps += [cap] * n
        idx += [k] * n
        prev = target
    return np.concatenate(rows), caps, np.array(idx, dtype=np.int64)


def curriculum_regime(
    lens: dict, kind: str, seq_len: int, batch: int, dp: int, steps: int, window: int, period: int, slack: float,
    seed: int, edge_windows: tuple[int, ...] = (2, 1000),
) -> None:  # fmt: skip
    """A multi-phase run at one sequence per rank: the build's steps (B3, regroup off), weir (no edges), weir
    with the heaviest-first layout (``layout=0``) and weir with edges over each of ``edge_windows`` windows;
    ``mixture_error`` of the trainer's stream per 10-step window (and how many windows exceed 0.01) and per
    phase, against the plan's ramped per-step shares."""
    phases = curriculum(steps, kind)
    shares, caps, phase = planned_shares(phases)
    n = len(shares)
    packed = bfd(draw(lens, seq_len, batch, n, seed, shares, caps), seq_len, batch)
    starts = [int(np.flatnonzero(phase == k)[0]) for k in range(len(phases))]
    planned = shares * seq_len * batch
    run = SimulatedShards(packed, batch, starts)
    streams = {"B3 (off)": [st.seqs for st in packed]}
    plan_ms: dict[str, float] = {"B3 (off)": 0.0}  # the planner's time per step laying the stream out

    def planned_stream(name: str, edges: int = EDGE_WINDOWS, layout: int = LAYOUT) -> None:
        t0 = time.perf_counter()
        streams[name] = regrouped_steps(run, window, period, slack, edges, layout)
        plan_ms[name] = (time.perf_counter() - t0) * 1000 / n

    planned_stream("weir")  # edges off (the default)
    planned_stream("weir, heaviest 1st", layout=0)
    for e in edge_windows:  # the trade-off: edges over more windows after each boundary
        planned_stream(f"weir, edges {e}", edges=e)
    desc = ", ".join(f"{p[0]} {p[1]}" + (f" ramp {p[3]} {p[4]}" if p[3] else "") for p in phases)
    print(f"\nS={seq_len} global_batch={batch} dp={dp} curriculum {kind}: {desc}")
    head = f"{'':20} {'dp_imb mean':>11} {'dp_imb p95':>10} {'mix_err/10':>10} {'over 0.01':>9}"
    print(f"{head} {'inside/10':>9} {'over 0.01':>9} {'mix_err/phase':>13} {'plan ms/step':>12}")
    for name, st in streams.items():
        per_step = [np.array([cost(s) for s in x]) for x in st]
        imb = [dp_imbalance(c, assign_ranks(c, dp), dp) for c in per_step]
        realized = np.array([sum((source_tokens(s) for s in x), np.zeros(len(MIXTURE))) for x in st])
        me = phase_error(realized, planned, phase, list(MIXTURE), [p[0] for p in phases])
        err = window_errors(realized, planned).max(axis=1)  # the worst source of each 10-step window
        inside = err[phase[: n - 9] == phase[9:]]  # the windows that cross no phase boundary
        print(
            f"{name:20} {np.mean(imb):11.3f} {np.percentile(imb, 95):10.3f} {me.window:10.4f} "
            f"{int((err > 0.01).sum()):>4}/{n - 9:<4} {inside.max():9.4f} "
            f"{int((inside > 0.01).sum()):>4}/{len(inside):<4} {me.phase:13.4f} {plan_ms[name]:12.0f}"
        )


def main() -> None:
    ap = run_arguments(__doc__.split("\n\n")[0])
    ap.add_argument("--edge-goal", type=float, help="loaders.refinement.EDGE_GOAL (the balance trade-off)")
    ap.add_argument(
        "--edge-windows", type=int, nargs="*", default=[2, 1000], help="edge rows: windows after a boundary"
    )
    ap.add_argument("--kind", choices=("same", "noramp", "ramps"), help="run only this curriculum")
    ap.add_argument("--seq-len", type=int, choices=(32768, 131072), help="run only at this S")
    args = ap.parse_args()
    if args.edge_goal is not None:
        refinement.EDGE_GOAL = args.edge_goal
    lens = real_lengths()
    for kind in ("same", "noramp", "ramps") if args.kind is None else (args.kind,):
        for s in (32768, 131072) if args.seq_len is None else (args.seq_len,):
            curriculum_regime(
                lens, kind, s, 16, 16, args.steps, args.window, args.period, args.slack, args.seed,
                tuple(args.edge_windows),
            )  # fmt: skip


if __name__ == "__main__":
    main()
