"""The hybrid deal's planning time alone: ``loaders.hybrid.deal`` per step, one thread, at 1 M tokens per step
over 64 ranks (the goal: ≤ 5 ms per step per rank, since every rank computes every step's deal itself).

Regimes: the steps of ``benchmarks/hybrid.py``'s simulated builds (three-phase ``ramps`` curricula, packed
best-fit decreasing, cost l² + 49152·l) at S=32768 × global batch 32 on dp 16 × cp 4 and S=131072 × 8 on
dp 8 × cp 8, capacity S / cp; "real": the real sources' lengths (``../shared/data``, skipped without it),
"longtail": ``benchmarks/hybrid.py``'s synthetic truncated-Pareto lengths.

Printed per regime and engine (``compiled``: numba's kernels, where numba is installed; ``numpy``: what a node
without numba runs): documents per step (median); the deal's milliseconds per step, wall-clock (``ms``) and
this thread's CPU time (``cpu_ms``: what a rank with a core of its own pays; on a shared machine the wall
clock adds the waits for a core), median, p95 and max over the steps, each dealt once after one warm-up deal
that loads or compiles the kernels; whether median and p95 are both
≤ 5 ms; the mean compute imbalance (max ÷ mean rank time) and mean busiest rank ÷ the floor ``max(mean,
longest per-rank document)`` of the deal's own degrees. ``--baseline REV``: the same steps dealt by
``loaders/`` and ``contract/`` as committed at ``REV`` (``git archive``, in a process of their own), timed
beside them, and how many steps each engine deals otherwise than ``REV`` (0: the same deal, array for
array, bit for bit).

    .venv/bin/python benchmarks/hybrid_plan.py [--steps 60] [--baseline REV] [--engine numpy] [--json]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # one thread: what a rank spends of its own core

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages: run as a script, only this folder is on the path

import argparse
import dataclasses
import json
import pickle
import subprocess
import tempfile
import time
from typing import Any

import numpy as np

SHAPES = [(32768, 32, 16, 4), (131072, 8, 8, 8)]  # S, global batch, dp, cp: 1 M tokens per step on 64 ranks
GOAL_MS = 5.0
ARRAYS = ("degree", "first_rank", "micro_batch", "rank_time")

# A regime handed to a timing: (name, steps' lengths, (dp, cp, capacity, gpus_per_node), cost fields)
Regime = tuple[str, list[np.ndarray], tuple[int, int, int, int], dict[str, Any]]


def time_deals(regimes: list[Regime], engines: list[str | None]) -> list[list[dict[str, Any]]]:
    """Per engine (None: the default) and regime: the seconds of ``loaders.hybrid.deal`` per step (seed: the
    step), wall-clock and this thread's CPU, after one warm-up deal per engine, and the deals' arrays; with
    whichever ``loaders`` is first on ``sys.path``. One engine after the other, each over all the steps, as
    a rank deals them."""
    from contract.cost import CostModel
    from loaders.hybrid import HybridWorld, deal

    out: list[list[dict[str, Any]]] = [[] for _ in engines]
    for _, steps, (dp, cp, capacity, gpn), fields in regimes:
        world, cost = HybridWorld(dp, cp, capacity, gpn), CostModel(**fields)
        calls = [{"engine": e} if e else {} for e in engines]
        for kwargs in calls:
            deal(steps[0], world, cost, seed=0, **kwargs)  # the kernels' load (or compile) is no step's
        runs: list[dict[str, Any]] = [{"seconds": [], "cpu": [], "deals": []} for _ in engines]
        for kwargs, run in zip(calls, runs, strict=True):
            for t, lens in enumerate(steps):
                c0, t0 = time.thread_time(), time.perf_counter()
                d = deal(lens, world, cost, seed=t, **kwargs)
                run["seconds"].append(time.perf_counter() - t0)
                run["cpu"].append(time.thread_time() - c0)
                arrays = {k: np.asarray(getattr(d, k)) for k in ARRAYS}
                run["deals"].append(arrays | {"micro_batches": int(d.micro_batches)})
        for k, run in enumerate(runs):
            out[k].append(run)
    return out


def baseline(rev: str, regimes: list[Regime]) -> list[dict[str, Any]]:
    """:func:`time_deals` of ``loaders/`` and ``contract/`` as committed at ``rev``, in a process of its own."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        archive = subprocess.run(
            ["git", "archive", rev, "loaders", "contract"], cwd=ROOT, capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
        (Path(tmp) / "in.pkl").write_bytes(pickle.dumps(regimes))
        code = (
            "import pickle, sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]; "
            "from benchmarks.hybrid_plan import time_deals; "
            "r = pickle.load(open(sys.argv[3], 'rb')); pickle.dump(time_deals(r, [None])[0], open(sys.argv[4], 'wb'))"
        )
        shim = Path(tmp) / "benchmarks"  # this file alone, beside the old tree: nothing else of today's is found
        shim.mkdir()
        (shim / "__init__.py").write_text("")
        (shim / "hybrid_plan.py").write_text(Path(__file__).read_text())
        env = {**os.environ, "PYTHONPATH": ""}
        args = [str(tree), tmp, str(Path(tmp) / "in.pkl"), str(Path(tmp) / "out.pkl")]
        subprocess.run([sys.executable, "-c", code, *args], cwd=tmp, env=env, check=True)
        result: list[dict[str, Any]] = pickle.loads((Path(tmp) / "out.pkl").read_bytes())
        return result


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["micro_batches"] == b["micro_batches"] and all(np.array_equal(a[k], b[k]) for k in ARRAYS)


def quality(deals: list[dict[str, Any]], steps: list[np.ndarray], cost: Any, gpn: int) -> dict[str, float]:
    """Mean compute imbalance, and mean busiest rank ÷ the floor of the deal's own degrees."""
    imbalance, over = [], []
    for d, lens in zip(deals, steps, strict=True):
        rt = d["rank_time"]
        t = np.asarray(cost.time(lens, d["degree"], gpn), dtype=np.float64)
        floor = max(float((d["degree"] * t).sum()) / len(rt), float(t.max()))
        imbalance.append(float(rt.max() / rt.mean()) if rt.mean() > 0 else 1.0)
        over.append(float(rt.max()) / floor)
    return {"imbalance": round(float(np.mean(imbalance)), 4), "over_floor": round(float(np.mean(over)), 4)}


def figures(seconds: list[float]) -> dict[str, float]:
    """Median, p95 and max milliseconds per step."""
    ms = 1000 * np.asarray(seconds)
    pairs = (("median", np.median(ms)), ("p95", np.percentile(ms, 95)), ("max", ms.max()))
    return {k: round(float(v), 2) for k, v in pairs}


def main() -> None:
    from benchmarks.hybrid import (
        commit,
        load_average,
        long_tailed,
        real_data_here,
        simulated_build,
        step_documents,
        uncommitted,
    )
    from benchmarks.simulation import SHARED, lengths
    from loaders.hybrid_kernels import default_engine

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=60, help="steps per regime (≥ 50 for a p95)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--baseline", metavar="REV", help="also time loaders/ and contract/ as committed at REV")
    ap.add_argument("--engine", choices=("compiled", "numpy"), action="append", help="default: every one here")
    ap.add_argument("--only", choices=("real", "longtail"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.steps < 30:
        ap.error(f"--steps {args.steps}: a simulated three-phase build takes at least 30 steps")
    engines = args.engine or (["compiled", "numpy"] if default_engine() == "compiled" else ["numpy"])
    head = {"commit": commit(), "uncommitted": uncommitted(), "cpus": os.cpu_count()}
    head["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(json.dumps(head | {"load_average": load_average()}) if args.json else f"{head} load {load_average()}")
    sources = []
    if args.only in (None, "real"):
        if real_data_here():
            sources.append(("real", lengths((SHARED or ROOT) / "data")))
        else:
            print("real-data regimes skipped: ../shared/data is not here (nor the cached lengths)")
    if args.only in (None, "longtail"):
        sources.append(("longtail", long_tailed(args.seed)))
    regimes: list[Regime] = []
    for name, lens in sources:
        for s, batch, dp, cp in SHAPES:
            build = simulated_build(f"{name} S={s}", lens, s, args.steps, args.seed, batch=batch, packer="bfd")
            steps = [step_documents(build, t)[0] for t in range(build.steps)]
            regimes.append((build.name, steps, (dp, cp, s // cp, 8), dataclasses.asdict(build.cost)))
    timed = dict(zip(engines, time_deals(regimes, list(engines)), strict=True))
    old = baseline(args.baseline, regimes) if args.baseline else None
    from contract.cost import CostModel

    for k, (name, steps, (dp, cp, capacity, gpn), fields) in enumerate(regimes):
        cost = CostModel(**fields)
        row: dict[str, Any] = {"regime": name, "dp": dp, "cp": cp, "capacity": capacity, "steps": len(steps)}
        row |= {"tokens": int(np.median([x.sum() for x in steps])), "docs": int(np.median([len(x) for x in steps]))}
        for engine, runs in timed.items():
            row[engine] = {"ms": figures(runs[k]["seconds"]), "cpu_ms": figures(runs[k]["cpu"])}
            row[engine] |= quality(runs[k]["deals"], steps, cost, gpn)
            if old is not None:
                differ = sum(not same(a, b) for a, b in zip(runs[k]["deals"], old[k]["deals"], strict=True))
                row[engine]["differing_steps"] = differ
            for key in ("ms", "cpu_ms"):
                ms = row[engine][key]
                row[engine][f"goal_met_{key}"] = ms["median"] <= GOAL_MS and ms["p95"] <= GOAL_MS
        if old is not None:
            figs = {"ms": figures(old[k]["seconds"]), "cpu_ms": figures(old[k]["cpu"])}
            row[f"baseline {args.baseline}"] = figs | quality(old[k]["deals"], steps, cost, gpn)
        row["load_average"] = load_average()
        print(json.dumps(row) if args.json else "  ".join(f"{key}: {v}" for key, v in row.items()))


if __name__ == "__main__":
    main()
