"""The hybrid layout measured on a GPU: every rank's micro-batches of real build steps, run one after another on
one GPU, against the cost model's prediction.

For each of a build's steps and each of the ``dp × cp`` ranks, the rank's micro-batches as
:class:`loaders.HybridStepLoader` deals them (the cost model fitted on this GPU by ``weir calibrate``'s
:func:`pipelines.calibrate.measure`, as a user would put it in the mix file) run one transformer layer's
attention forward and backward: the projections of the rank's slots (q, k, v and the output, as the
calibration times them) and one varlen causal attention call (flash, ``torch.nn.attention.varlen``) over the
rank's pieces. A document whole on the rank attends to itself; a document split over a block of ``d`` ranks
is Transformer Engine's THD partition, so the rank's two chunks ``r`` and ``2d − 1 − r`` attend to the
document's keys up to their ends (bottom-right causal), the other ranks' keys and values standing in for
what the block's all-gather would bring. The same for the fixed layout (the build's steps dealt to DP ranks by
the loader's planner, ``window`` 1; every sequence split over all ``cp`` ranks of its DP rank, one sequence
per micro-batch). One GPU cannot measure communication: the figures are compute, measured and predicted.

Printed per layout: measured and predicted step time (the busiest rank's, summed over the steps) and their
ratio to the fixed layout's, compute imbalance (max ÷ mean over ranks, per step: mean and max), and how well the
prediction ranks the ranks (per-rank relative error median / p95, Pearson r); then the constants a least-squares
fit of the measured rank times gives (attention l²/d, linear l/d, per document, per micro-batch).

    python benchmarks/hybrid_gpu.py --build build/hybrid_gpu --dp 16 --cp 4 [--json]
    python benchmarks/hybrid_gpu.py --build build/demo --dp 2 --cp 2 --device cpu --heads 2 --head-dim 16  # smoke
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages: run as a script, only this folder is on the path

import argparse
import json
import os
from typing import Any

import numpy as np
import torch

from contract.cost import CostModel
from loaders.hybrid import HybridWorld
from loaders.hybrid_steps import HybridStepLoader, steps_dataset
from pipelines.calibrate import AttentionLayer, fit, measure

Pieces = tuple[np.ndarray, np.ndarray, int]  # per micro-batch: query lengths, key lengths, tokens whole (degree 1)


def thd_pieces(padded: np.ndarray, degree: int, local: int) -> tuple[np.ndarray, np.ndarray]:
    """(query lengths, key lengths) int64 of rank ``local``'s two chunks of each document of ``padded`` tokens
    (multiples of ``2·degree``) split over ``degree`` ranks: chunks ``local`` and ``2·degree − 1 − local``, each
    attending to the document's keys up to its own end."""
    c = np.asarray(padded, np.int64) // (2 * degree)
    q = np.repeat(c, 2)
    k = np.stack([(local + 1) * c, (2 * degree - local) * c], axis=1).reshape(-1)
    return q, k


def hybrid_pieces(mb: dict[str, Any]) -> Pieces:
    """A :class:`loaders.HybridStepLoader` micro-batch as attention pieces: whole documents first."""
    whole_q: list[np.ndarray] = []
    split_q: list[np.ndarray] = []
    split_k: list[np.ndarray] = []
    for b in mb["blocks"]:
        if b.local_cp_size == 1:
            whole_q.append(np.diff(b.cu_seqlens.numpy()).astype(np.int64))
        else:
            q, k = thd_pieces(np.diff(b.cu_seqlens_padded.numpy()), b.local_cp_size, b.local_cp_rank)
            split_q.append(q)
            split_k.append(k)
    w = np.concatenate(whole_q) if whole_q else np.zeros(0, np.int64)
    q = np.concatenate([w, *split_q])
    return q, np.concatenate([w, *split_k]), int(w.sum())


def fixed_pieces(lengths: np.ndarray, cp: int, local: int) -> Pieces:
    """One sequence of documents of ``lengths`` split over ``cp`` ranks, every document cut into ``2·cp`` chunks
    (its padded length a multiple of ``2·cp``), as the fixed layout runs it on CP rank ``local``."""
    if cp == 1:
        return lengths, lengths, int(lengths.sum())
    q, k = thd_pieces(-(-lengths // (2 * cp)) * 2 * cp, cp, local)
    return q, k, 0


def predicted(cost: CostModel, micro_batches: list[Pieces], docs: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """A rank's predicted compute seconds: Σ over the documents it holds (lengths, degrees) of ``cost.compute``,
    plus ``per_micro_batch`` per micro-batch, in seconds."""
    units = sum(float(np.sum(cost.compute(lens, deg))) for lens, deg in docs) + cost.per_micro_batch * len(
        micro_batches
    )
    return units * cost.unit_seconds


def features(micro_batches: list[Pieces], docs: list[tuple[np.ndarray, np.ndarray]]) -> list[float]:
    """A rank's work as the cost model's terms: Σ l²/d, Σ l/d, documents, micro-batches."""
    lens = np.concatenate([lens for lens, _ in docs]).astype(np.float64) if docs else np.zeros(0)
    deg = np.concatenate([d for _, d in docs]).astype(np.float64) if docs else np.zeros(0)
    return [float(np.sum(lens * lens / deg)), float(np.sum(lens / deg)), float(len(lens)), float(len(micro_batches))]


def measure_layouts(args: argparse.Namespace, cost: CostModel, layer: AttentionLayer) -> dict[str, dict[str, Any]]:
    """Per layout: per step, per rank, (measured seconds, predicted seconds, features)."""
    ds = steps_dataset(args.build)  # the build's own steps, read once for every rank
    world = HybridWorld(dp=args.dp, cp=args.cp, capacity=args.capacity or ds.facts.seq_len // args.cp)
    loaders = [HybridStepLoader(ds, world, r, cost=cost) for r in range(world.size)]
    offs, segs = ds.shards.segments
    planner = ds.planner
    steps = range(min(args.steps, loaders[0].steps))
    out: dict[str, dict[str, Any]] = {"hybrid": {"steps": []}, "fixed": {"steps": []}}
    for t in steps:
        per_rank: dict[str, list[tuple[list[Pieces], list[tuple[np.ndarray, np.ndarray]]]]] = {
            "hybrid": [],
            "fixed": [],
        }
        deal = None
        for r, ld in enumerate(loaders):
            st = ld.get_step(t)
            deal = st.deal
            mbs = [hybrid_pieces(mb) for mb in st.micro_batches]
            held = np.concatenate(st.deal.rank_documents(r)) if st.deal.micro_batches else np.zeros(0, np.int64)
            per_rank["hybrid"].append((mbs, [(st.lengths[held], st.deal.degree[held])]))
        for seqs in planner.assignment(t, args.dp):
            seq_lens = [segs[offs[s] : offs[s + 1], 3].astype(np.int64) for s in seqs]  # (source, doc, start, length)
            for local in range(args.cp):
                mbs = [fixed_pieces(lens, args.cp, local) for lens in seq_lens]
                docs = [(lens, np.full(len(lens), args.cp)) for lens in seq_lens]
                per_rank["fixed"].append((mbs, docs))
        if t == steps[0]:  # warm the kernels up on every shape class once
            for name in per_rank:
                for mbs, _ in per_rank[name]:
                    layer.timed(mbs, 1)
        for name, ranks in per_rank.items():
            rows = [
                (layer.timed(mbs, args.repeats), predicted(cost, mbs, docs), features(mbs, docs)) for mbs, docs in ranks
            ]
            out[name]["steps"].append(rows)
        assert deal is not None
        print(f"step {t}: {len(deal.degree)} documents, {deal.micro_batches} micro-batches", file=sys.stderr)
    return out


def summary(
    rows_per_step: list[list[tuple[float, float, list[float]]]], base: dict[str, float] | None
) -> dict[str, Any]:
    """The printed figures of one layout (see the module's docstring)."""
    meas = [np.array([r[0] for r in rows]) for rows in rows_per_step]
    pred = [np.array([r[1] for r in rows]) for rows in rows_per_step]
    m_all, p_all = np.concatenate(meas), np.concatenate(pred)
    rel = np.abs(p_all - m_all) / m_all
    fig = {
        "measured_step_s": float(sum(m.max() for m in meas)),
        "predicted_step_s": float(sum(p.max() for p in pred)),
        "measured_imbalance_mean": float(np.mean([m.max() / m.mean() for m in meas])),
        "measured_imbalance_max": float(np.max([m.max() / m.mean() for m in meas])),
        "predicted_imbalance_mean": float(np.mean([p.max() / p.mean() for p in pred])),
        "predicted_imbalance_max": float(np.max([p.max() / p.mean() for p in pred])),
        "rank_error_median": float(np.median(rel)),
        "rank_error_p95": float(np.percentile(rel, 95)),
        "pearson_r": float(np.corrcoef(p_all, m_all)[0, 1]) if len(m_all) > 1 else 1.0,
    }
    if base:
        fig["measured_ratio_to_fixed"] = base["measured_step_s"] / fig["measured_step_s"]
        fig["predicted_ratio_to_fixed"] = base["predicted_step_s"] / fig["predicted_step_s"]
    return fig


def refit(layouts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Least squares of every measured rank time (both layouts) on its terms: seconds per l²/d, per l/d, per
    document and per micro-batch (each ≥ 0), weighted by 1/seconds, with its median relative error."""
    rows = [r for lay in layouts.values() for step in lay["steps"] for r in step if r[0] > 0]
    a = np.array([r[2] for r in rows])
    t = np.array([r[0] for r in rows])
    full, _ = fit(a, t)  # the same non-negative weighted least squares as the calibration
    err = np.abs(a @ full - t) / t
    names = ("attention_s", "linear_s", "per_document_s", "per_micro_batch_s")
    return {
        **dict(zip(names, full.tolist(), strict=True)),
        "error_median": float(np.median(err)),
        "error_p95": float(np.percentile(err, 95)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", required=True, help="a finished build folder (its shards)")
    ap.add_argument("--dp", type=int, required=True)
    ap.add_argument("--cp", type=int, required=True)
    ap.add_argument("--capacity", type=int, help="tokens a rank holds per micro-batch (default S / cp)")
    ap.add_argument("--steps", type=int, default=10, help="the build's first steps measured")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--max-len", type=int, default=65536, help="longest document the calibration times")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("hybrid_gpu: no GPU here; this check runs on a GPU (or --device cpu for a smoke run)", file=sys.stderr)
        sys.exit(2)
    torch.manual_seed(0)
    cal = measure(args.device, 256 if args.device == "cpu" else 1024, args.max_len, args.heads, args.head_dim)
    # float fields of CostModel only; as dict[str, float], mypy would check them against its tuple fields too
    fields: dict[str, Any] = cal.cost()
    cost = CostModel(**fields)  # what `weir calibrate` prints for the mix file
    layer = AttentionLayer(args.device, args.heads, args.head_dim)
    layouts = measure_layouts(args, cost, layer)
    fixed = summary(layouts["fixed"]["steps"], None)
    result = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "build": args.build,
        "world": {"dp": args.dp, "cp": args.cp},
        "steps": len(layouts["fixed"]["steps"]),
        "attention": layer.attention,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "calibration": {
            "alpha": cal.alpha,
            "beta": cal.beta,
            "delta": cal.delta,
            "gamma": cal.gamma,
            "worst": cal.worst,
            "comm_bytes": cal.comm_bytes,
            "points": [
                [int(m), int(n), float(t)] for m, n, t in zip(cal.documents, cal.lengths, cal.seconds, strict=True)
            ],
        },
        "fixed": fixed,
        "hybrid": summary(layouts["hybrid"]["steps"], fixed),
        "refit": refit(layouts),
        "load_average": list(os.getloadavg()),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['device']} · torch {result['torch']} · {layer.attention} · dp {args.dp} × cp {args.cp} · "
        f"{result['steps']} steps"
    )
    k = result["calibration"]
    print(
        f"calibrated: {k['alpha']:.4g}·Σl² + {k['beta']:.4g}·Σl + {k['delta']:.4g}/document + "
        f"{k['gamma']:.4g}/micro-batch s (worst point {k['worst']:.1%})"
    )
    for name in ("fixed", "hybrid"):
        f = result[name]
        print(f"{name:>6}: " + ", ".join(f"{k} {v:.4g}" for k, v in f.items()))
    print("refit: " + ", ".join(f"{k} {v:.4g}" for k, v in result["refit"].items()))
    print(f"load average {result['load_average']}")


if __name__ == "__main__":
    main()
