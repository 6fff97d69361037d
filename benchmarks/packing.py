"""Packing benchmark: weir's best-fit-decreasing packing beside concatenate-and-chunk, on real data.

Builds a five-source mix of the real sets in ``../shared/data`` (books, code, math, chat, multilingual)
through the real pipeline stages (``mixing.stages``) into a temporary folder, tokenized with tiktoken
``o200k_base`` from ``../shared/tokenizers``, at S=8192, then prints for the same plan:

- ``packing_efficiency`` = real tokens ÷ (sequences × S) and ``truncated_docs`` = documents ≤ S that were
  split ÷ all documents (occurrences in the plan), for weir and for the baseline B0
  (concatenate the plan's documents in order and cut every S tokens);
- the spread of per-sequence cost (max/mean, cv; cost = attention·l² + linear·l from the mix);
- ``mixture_error`` (realized vs planned token shares, per 10-step window and per phase) for weir's
  shards, for B0 and for the plan itself;
- packing throughput (documents/s) and each stage's wall time, so one can see packing is not the slow stage.

Run:  .venv/bin/python benchmarks/packing.py            (about a minute on 2 cores)
      .venv/bin/python benchmarks/packing.py --steps 400 --global-batch 64   (bigger)
"""

from __future__ import annotations

import sys
from pathlib import Path

# This folder holds tokenize.py (the tokenizer benchmark): run as a script, it would shadow the standard
# library's tokenize for every module imported below, so take this folder off the import path first.
if Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import os
import tempfile
import time

import duckdb
import numpy as np
import polars as pl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mixing import stages
from mixing.layout import BuildLayout
from mixing.mixfile import parse_mix
from mixing.mixture import GOAL_PHASE, GOAL_WINDOW, mixture_error, plan_mixture_error
from mixing.packed import inspect_build, write_packed
from mixing.packing import Packing, pack_plan
from mixing.tokenizer import load_tokenizer

SHARED = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()), None)

MIX = """\
name: packing_bench
seed: 17
tokenizer: {{kind: tiktoken, name: o200k_base}}
sequence: {{length: {seq_len}, global_batch: {batch}}}
sources:
  books:        {{uri: "{data}/gutenberg_books_subset/*/*.txt", format: text, max_epochs: 200}}
  code:         {{uri: "{{stdlib}}/*.py", format: text, max_epochs: 200}}
  math:         {{uri: "{data}/gsm8k/train.jsonl", format: jsonl, template: "{{question}}\\n\\n{{answer}}",
                  max_epochs: 200}}
  chat:         {{uri: "{data}/hh_rlhf_harmless_base_test/test.jsonl.gz", format: jsonl, field: chosen,
                  max_epochs: 200}}
  multilingual: {{uri: "{data}/udhr2_multilingual/udhr2/*.txt", format: text, max_epochs: 200}}
curriculum:
  - {{phase: main,   steps: {main}, mixture: {{books: 0.35, code: 0.2, math: 0.15, chat: 0.1, multilingual: 0.2}}}}
  - {{phase: anneal, steps: {anneal}, mixture: {{books: 0.2, code: 0.2, math: 0.3, chat: 0.2, multilingual: 0.1}}}}
balance: {{cost: {{attention: 1.0, linear: 8192}}}}
"""


def baseline_concat_chunk(units: np.ndarray, doc_len: np.ndarray, seq_len: int) -> dict[str, float]:
    """B0: the plan's units back to back in plan order, cut every S tokens.

    ``units`` int64 [n, 2] = (length, start) per unit, ``doc_len`` the whole document's length.
    """
    ends = np.cumsum(units[:, 0])
    starts = ends - units[:, 0]
    tokens = int(ends[-1])
    n_seq = -(-tokens // seq_len)
    whole = doc_len <= seq_len
    split = whole & (starts // seq_len != (ends - 1) // seq_len)
    n_docs = int((units[:, 1] == 0).sum())  # document occurrences: each has exactly one unit starting at 0
    return {
        "packing_efficiency": tokens / (n_seq * seq_len),
        "truncated_docs": float(split.sum() / n_docs),
        "sequences": n_seq,
        "seq_lens": np.minimum(seq_len, tokens - np.arange(n_seq) * seq_len),
        "cuts": (starts, ends),
    }


def baseline_mixture(
    units: np.ndarray, steps: int, seq_len: int, batch: int, quotas: pl.DataFrame
) -> tuple[float, float]:
    """``mixture_error`` of B0: the plan's units (``units`` int64 [n, 2] = (length, source index) in plan
    order) back to back, step k holding tokens [k·C, (k+1)·C) with C = batch·S, against the plan's
    ``quotas`` (a ``plan_quotas`` frame)."""
    sources = sorted(quotas["source"].unique().to_list())
    ends = np.cumsum(units[:, 0])
    cum = np.zeros((len(units) + 1, len(sources)))  # tokens of each source before unit i
    np.add.at(cum[1:], (np.arange(len(units)), units[:, 1]), units[:, 0])
    cum = np.cumsum(cum, axis=0)
    at = np.minimum(np.arange(steps + 1) * batch * seq_len, ends[-1])  # step boundaries, as token positions
    i = np.searchsorted(ends, at, side="right")  # the unit each boundary falls in
    upto = cum[np.minimum(i, len(units))].copy()
    inside = i < len(units)
    starts = ends - units[:, 0]
    upto[inside, units[i[inside], 1]] += at[inside] - starts[i[inside]]
    realized = np.diff(upto, axis=0)
    wide = quotas.pivot(on="source", index=["step", "phase"], values="quota").sort("step")
    phase_names = list(dict.fromkeys(wide["phase"].to_list()))
    phase = np.array([phase_names.index(p) for p in wide["phase"].to_list()])
    me = mixture_error(realized, wide.select(sources).to_numpy(), phase, sources, phase_names)
    return me.window, me.phase


def _cost_spread(cost: np.ndarray) -> tuple[float, float]:
    m = float(cost.mean())
    return float(cost.max() / m), float(cost.std() / m)


def _baseline_cost(starts: np.ndarray, ends: np.ndarray, seq_len: int, att: float, lin: float) -> np.ndarray:
    """Per-sequence cost of B0 (documents cut at sequence edges: each piece costs as its own document)."""
    out = np.zeros(-(-int(ends[-1]) // seq_len))
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        while s < e:
            k = s // seq_len
            piece = min(e, (k + 1) * seq_len) - s
            out[k] += att * piece * piece + lin * piece
            s += piece
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40, help="total steps (80%% main, 20%% anneal)")
    ap.add_argument("--keep", type=Path, help="build here and keep it (default: a temporary folder)")
    args = ap.parse_args()
    if SHARED is None:
        print("../shared is not here: this benchmark needs the real data sets (skipped)")
        return 0
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tokenizers" / "tiktoken_cache"))
    anneal = max(1, args.steps // 5)
    text = MIX.format(
        seq_len=args.seq_len, batch=args.global_batch, data=SHARED / "data", main=args.steps - anneal, anneal=anneal
    )
    mix = parse_mix(text, "packing_bench.yaml")
    with tempfile.TemporaryDirectory(prefix="weir-packing-") as tmp:
        layout = BuildLayout(args.keep or Path(tmp))
        times: dict[str, float] = {}

        def timed(name: str, fn, *a, **kw):  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            r = fn(*a, **kw)
            times[name] = times.get(name, 0.0) + time.perf_counter() - t
            return r

        for name in mix.sources:
            timed("index", stages.index, mix, layout, name)
        timed("tokenizer", stages.prepare_tokenizer, mix, layout)
        for name in mix.sources:
            timed("tokenize", stages.tokenize, mix, layout, name)
        timed("length_stats", stages.length_stats, mix, layout)
        timed("plan", stages.plan, mix, layout)
        cost = (mix.balance.cost.attention, mix.balance.cost.linear)
        packing: Packing = timed("pack (bin packing)", pack_plan, layout.duckdb, args.seq_len, args.global_batch, cost)
        tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
        timed(
            "pack (gather + write shards)",
            write_packed,
            mix,
            layout,
            packing,
            tok.fingerprint,
            tok.vocab_size,
            tok.eos_id,
        )
        report = inspect_build(layout.root)
        plan_me = plan_mixture_error(layout.duckdb)
        with duckdb.connect(str(layout.duckdb), read_only=True) as con:
            rows = con.sql(
                "SELECT u.length, u.start, d.n_tokens, u.source FROM plan_units u JOIN documents d "
                "USING (source, doc_id) ORDER BY u.step, u.source, u.ord"
            ).fetchnumpy()
            quotas = con.sql("SELECT step, phase, source, quota FROM plan_quotas").pl()
            per_src = con.sql(
                "SELECT source, count(*), median(n_tokens), max(n_tokens) FROM documents GROUP BY 1 ORDER BY 1"
            ).fetchall()
    n_units = len(rows["length"])
    base = baseline_concat_chunk(
        np.stack([rows["length"], rows["start"]], axis=1).astype(np.int64),
        np.asarray(rows["n_tokens"], np.int64),
        args.seq_len,
    )
    src_names = sorted(set(rows["source"].tolist()))
    src = np.array([src_names.index(x) for x in rows["source"]], np.int64)
    b_mix = baseline_mixture(
        np.stack([np.asarray(rows["length"], np.int64), src], axis=1),
        mix.total_steps,
        args.seq_len,
        args.global_batch,
        quotas,
    )
    b_cost = _baseline_cost(*base["cuts"], args.seq_len, *cost)
    w_cost = packing.seq_cost
    print(f"mix: {mix.total_steps} steps × {args.global_batch} sequences × S={args.seq_len}, tokenizer o200k_base")
    print("sources (documents, median tokens, max tokens):")
    for s, n, med, mx in per_src:
        print(f"  {s:13s} {n:7,d} {med:9,.0f} {mx:11,d}")
    print(f"planned units (documents or S-pieces of longer ones): {n_units:,}\n")
    w_eff, w_trunc = report["packing_efficiency"], report["truncated_docs"]
    print(f"{'':28s}{'weir (BFD)':>14s}{'B0 concat+chunk':>18s}")
    print(f"{'packing_efficiency':28s}{w_eff:14.4f}{base['packing_efficiency']:18.4f}")
    print(f"{'truncated_docs':28s}{w_trunc:14.4f}{base['truncated_docs']:18.4f}")
    print(f"{'sequences':28s}{report['sequences']:14,d}{base['sequences']:18,d}")
    print(f"{'tokens dropped (phase ends)':28s}{report['tokens_dropped']:14,d}{0:18,d}")
    wm, wc = _cost_spread(w_cost)
    bm, bc = _cost_spread(b_cost)
    print(f"{'sequence cost max/mean':28s}{wm:14.3f}{bm:18.3f}")
    print(f"{'sequence cost cv':28s}{wc:14.3f}{bc:18.3f}")
    me = report["mixture_error"]
    for label, w, base_v, plan_v, goal in (
        ("mixture_error 10-step window", me["window"], b_mix[0], plan_me.window, GOAL_WINDOW),
        ("mixture_error phase", me["phase"], b_mix[1], plan_me.phase, GOAL_PHASE),
    ):
        print(f"{label:28s}{w:14.4f}{base_v:18.4f}   (the plan itself {plan_v:.4f}; goal ≤ {goal})")
    pack_s = times["pack (bin packing)"]
    print(f"\npacking throughput: {n_units / pack_s:,.0f} documents/s ({n_units:,} units in {pack_s:.3f} s)")
    print("stage wall times (s):")
    for k, v in times.items():
        print(f"  {k:30s}{v:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
