"""Packing benchmark: weir's packer, the same without its phase-end choice (by length), and concatenate-and-chunk.

Builds a five-source mix of the real sets in ``../shared/data`` (books, code, math, chat, multilingual)
through the real pipeline stages (``mixing.stages``) into a temporary folder, tokenized with tiktoken
``o200k_base`` from ``../shared/tokenizers``, at S=8192 (``--seq-len``), then prints for the same plan:

- ``packing_efficiency`` = real tokens ÷ (sequences × S) and ``truncated_docs`` = documents ≤ S that were
  split ÷ all documents (occurrences in the plan), for weir and for the baseline B0
  (concatenate the plan's documents in order and cut every S tokens);
- the spread of per-sequence cost (max/mean, cv; cost = attention·l² + linear·l from the mix);
- ``mixture_error`` (realized vs planned token shares, per 10-step window and per phase) for weir's
  shards, for B0 and for the plan itself;
- what the phase ends drop, with weir's seeded choice (``mixing.pack.phase_end``)
  and without it (``fair_drops=False``: a phase end drops what the last fill left): tokens dropped, the dropped
  units' mean length percentile within their source (mid-rank among the source's planned units; 0.5 when the
  choice is blind to length), the documents planned in a phase that no step of that phase delivered, and the
  longest any unit waited past its planned step; beside them, the units starting a document dropped when the
  plan is not fitted to its packing (the plan as drawn; the plan stage defers those: docs/design.md);
- packing throughput (documents/s, best of ``--repeat``) and peak memory (tracemalloc, bytes per unit) of
  weir's packer (``mixing.pack.packing.pack_plan``, compiled with numba where installed), with and without the
  choice, beside the reference packer (``pack_plan`` of ``tests/mixing/pack/reference.py``, pure Python, which
  must give the same packing), with the quality figures above computed the same way from each packing (and,
  for weir's, checked against ``inspect_build`` of its shards);
- each stage's wall time, and the load average before and after.

Run:  .venv/bin/python benchmarks/packing.py            (about a minute on 2 cores)
      .venv/bin/python benchmarks/packing.py --steps 400 --global-batch 64   (bigger: ~435,000 units)
      .venv/bin/python benchmarks/packing.py --seq-len 32768 --global-batch 16 --steps 200   (long context)

This script holds the CLI, the build, the timing and the printing; the baseline B0 and the quality figures
(efficiency, truncation, cost spread, mixture error, phase-end drops, one document's share) are
``benchmarks/packing_measures.py``'s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import duckdb
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.packing_measures import (
    _baseline_cost,
    _cost_spread,
    baseline_concat_chunk,
    baseline_mixture,
    document_share,
    drop_figures,
    packing_figures,
)
from mixing import stages
from mixing.ingest.tokenizer import load_tokenizer
from mixing.mixfile.mix import parse_mix
from mixing.output.layout import BuildLayout
from mixing.pack.packed import write_packed
from mixing.pack.packing import pack_plan, stream_plan
from mixing.pack.pool import default_engine
from mixing.pack.result import Packing
from mixing.plan.curriculum_plan import make_plan
from mixing.plan.database import duckdb_config
from mixing.plan.mixture import GOAL_PHASE, GOAL_WINDOW, plan_mixture_error
from mixing.report import inspect_build
from tests.mixing.pack import reference as _packing_v1

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


def _timed_best(fn, repeat: int) -> tuple[Packing, float]:  # type: ignore[no-untyped-def]
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best  # type: ignore[return-value]


def _timed_pair(fa, fb, repeat: int) -> tuple[tuple[Packing, float, float], tuple[Packing, float, float]]:  # type: ignore[no-untyped-def]
    """Each of two packers' result, best wall time and best CPU time (this process's, the reading thread's
    included) of ``repeat`` runs, the two taking turns: a shared machine's load then weighs on both alike, and
    the CPU time hardly at all."""
    wall, cpu, out = [float("inf")] * 2, [float("inf")] * 2, [None, None]
    for _ in range(repeat):
        for i, fn in enumerate((fa, fb)):
            t, c = time.perf_counter(), time.process_time()
            out[i] = fn()
            wall[i], cpu[i] = min(wall[i], time.perf_counter() - t), min(cpu[i], time.process_time() - c)
    return (out[0], wall[0], cpu[0]), (out[1], wall[1], cpu[1])  # type: ignore[return-value]


def _peak_bytes(fn) -> int:  # type: ignore[no-untyped-def]
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _plan_units(db: Path, names: list[str]) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The plan's units (``src`` by ``names``, doc_id, start, step, length, phase index) and each step's phase
    index, as :func:`benchmarks.packing_measures.drop_figures` takes them."""
    phases = "(SELECT phase, row_number() OVER (ORDER BY min(step)) - 1 AS i FROM plan_quotas GROUP BY 1)"
    with duckdb.connect(str(db), read_only=True) as con:
        plan = {
            k: np.asarray(v, np.int64)
            for k, v in con.sql(
                "SELECT list_position($n, source) - 1 AS src, doc_id, start, step, length, p.i AS phase "
                f"FROM plan_units JOIN {phases} p USING (phase)",
                params={"n": names},
            )
            .fetchnumpy()
            .items()
        }
        query = f"SELECT p.i FROM (SELECT DISTINCT step, phase FROM plan_quotas) q JOIN {phases} p USING (phase)"
        phase_of_step = np.asarray(con.sql(query + " ORDER BY step").fetchnumpy()["i"], np.int64)
    return plan, phase_of_step


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--global-batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=40, help="total steps (80%% main, 20%% anneal)")
    ap.add_argument("--repeat", type=int, default=3, help="time each packer this many times, keep the best")
    ap.add_argument("--chunk-units", type=int, default=1 << 18, help="units per block read from DuckDB")
    ap.add_argument("--keep", type=Path, help="build here and keep it (default: a temporary folder)")
    args = ap.parse_args()
    if SHARED is None:
        print("../shared is not here: this benchmark needs the real data sets (skipped)")
        return 0
    load_before = os.getloadavg()
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
        cost = mix.balance.cost.model()
        db, S, B = layout.duckdb, args.seq_len, args.global_batch
        engine = default_engine()
        t = time.perf_counter()
        # the first call in a process loads (or compiles) the numba kernels: timed on its own
        pack_plan(db, S, B, cost, chunk_units=args.chunk_units)
        first_call = time.perf_counter() - t
        old, old_s = _timed_best(lambda: _packing_v1.pack_plan(db, S, B, cost), args.repeat)
        (packing, new_s, new_cpu), (by_len, by_len_s, by_len_cpu) = _timed_pair(
            lambda: pack_plan(db, S, B, cost, chunk_units=args.chunk_units),
            lambda: pack_plan(db, S, B, cost, chunk_units=args.chunk_units, fair_drops=False),
            args.repeat,
        )
        old_by_len = _packing_v1.pack_plan(db, S, B, cost, fair_drops=False)
        py_s = (
            _timed_best(lambda: pack_plan(db, S, B, cost, engine="python", chunk_units=args.chunk_units), 1)[1]
            if engine != "python"
            else new_s
        )
        old_peak = _peak_bytes(lambda: _packing_v1.pack_plan(db, S, B, cost))
        new_peak = _peak_bytes(lambda: pack_plan(db, S, B, cost, chunk_units=args.chunk_units))
        times["pack (bin packing)"] = new_s
        tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
        timed(
            "pack (bin packing again, gather + write shards)",
            write_packed,
            mix,
            layout,
            stream_plan(db, S, B, cost, chunk_units=args.chunk_units),
            tok.fingerprint,
            tok.vocab_size,
            tok.eos_id,
        )
        report = inspect_build(layout.root)
        plan_me = plan_mixture_error(layout.duckdb)
        spread_share = document_share(packing)
        with duckdb.connect(str(layout.duckdb), read_only=True) as con:
            rows = con.sql(
                "SELECT u.length, u.start, d.n_tokens, u.source FROM plan_units u JOIN documents d "
                "USING (source, doc_id) ORDER BY u.step, u.source, u.ord"
            ).fetchnumpy()
            quotas = con.sql("SELECT step, phase, source, quota FROM plan_quotas").pl()
            per_src = con.sql(
                "SELECT source, count(*), median(n_tokens), max(n_tokens) FROM documents GROUP BY 1 ORDER BY 1"
            ).fetchall()
            docs = con.sql("SELECT source, doc_id, n_tokens FROM documents").pl()
        names = list(packing.sources)
        plan, phase_of_step = _plan_units(layout.duckdb, names)
        make_plan(mix, layout.duckdb, duckdb_config())  # as drawn, before the plan stage fits it to its packing
        unfitted = drop_figures(pack_plan(db, S, B, cost, chunk_units=args.chunk_units), *_plan_units(db, names))
        make_plan(mix, layout.duckdb, duckdb_config(), spread=False)  # the pieces of a document consecutive
        consecutive_share = document_share(pack_plan(db, S, B, cost, chunk_units=args.chunk_units))
    doc_len = {}
    for (name,), d in docs.group_by("source"):
        doc_len[str(name)] = np.zeros(int(d["doc_id"].max()) + 1, np.int64)
        doc_len[str(name)][d["doc_id"].to_numpy()] = d["n_tokens"].to_numpy()
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
    cut_starts, cut_ends = base["cuts"]
    b_cost = _baseline_cost(cut_starts, cut_ends, args.seq_len, cost)
    weir = packing_figures(packing, quotas, doc_len) | drop_figures(packing, plan, phase_of_step)
    by_length = packing_figures(by_len, quotas, doc_len) | drop_figures(by_len, plan, phase_of_step)
    me = report.mixture_error
    shards_agree = (
        abs(weir["packing_efficiency"] - report.packing_efficiency) < 1e-12
        and weir["truncated_docs"] == report.truncated_docs
        and weir["tokens_dropped"] == report.tokens_dropped
        and abs(weir["window"] - me.window) < 1e-12
        and abs(weir["phase"] - me.phase) < 1e-12
    )
    fields = ("seq_step", "seg_offsets", "segments", "dropped")
    same = all(np.array_equal(getattr(packing, f), getattr(old, f)) for f in fields) and all(
        np.array_equal(getattr(by_len, f), getattr(old_by_len, f)) for f in fields
    )
    print(f"mix: {mix.total_steps} steps × {args.global_batch} sequences × S={args.seq_len}, tokenizer o200k_base")
    print("sources (documents, median tokens, max tokens):")
    for s, n, med, mx in per_src:
        print(f"  {s:13s} {n:7,d} {med:9,.0f} {mx:11,d}")
    print(f"planned units (documents or S-pieces of longer ones): {n_units:,}\n")
    print(f"{'':28s}{'weir':>12s}{'by length':>13s}{'B0 concat+chunk':>18s}   ('by length': weir without "
          "the phase end's seeded choice)")  # fmt: skip
    print(f"{'packing_efficiency':28s}{weir['packing_efficiency']:12.4f}{by_length['packing_efficiency']:13.4f}"
          f"{base['packing_efficiency']:18.4f}")  # fmt: skip
    print(f"{'truncated_docs':28s}{weir['truncated_docs']:12.4f}{by_length['truncated_docs']:13.4f}"
          f"{base['truncated_docs']:18.4f}")  # fmt: skip
    print(f"{'sequences':28s}{weir['sequences']:12,d}{by_length['sequences']:13,d}{base['sequences']:18,d}")
    print(f"{'tokens dropped (phase ends)':28s}{weir['tokens_dropped']:12,d}{by_length['tokens_dropped']:13,d}{0:18,d}")
    print(f"{'units dropped':28s}{weir['units']:12,d}{by_length['units']:13,d}{0:18,d}")
    print(f"{'dropped: mean length pct':28s}{weir['pct']:12.3f}{by_length['pct']:13.3f}{'':18s}   (within its source; "
          "0.5: blind to length)")  # fmt: skip
    print(f"{'documents a phase never gave':28s}{weir['lost']:12,d}{by_length['lost']:13,d}{0:18,d}   "
          "(planned in a phase, in none of its steps)")  # fmt: skip
    print(f"{'first pieces dropped':28s}{weir['first']:12,d}{by_length['first']:13,d}{0:18,d}   "
          "(whole documents, or a long one's beginning: an epoch's occurrence lost)")  # fmt: skip
    print(f"{'  the plan not fitted':28s}{unfitted['first']:12,d}{'':13s}{'':18s}   (the plan as drawn, before "
          f"the plan stage fits it to its packing; documents a phase never gave {unfitted['lost']:,})")  # fmt: skip
    print(f"{'longest wait (steps)':28s}{weir['wait']:12,d}{by_length['wait']:13,d}{'':18s}   "
          "(placed step − planned step, the most of any unit)")  # fmt: skip
    bm, bc = _cost_spread(b_cost)
    print(f"{'sequence cost max/mean':28s}{weir['cost_max']:12.3f}{by_length['cost_max']:13.3f}{bm:18.3f}")
    print(f"{'sequence cost cv':28s}{weir['cost_cv']:12.3f}{by_length['cost_cv']:13.3f}{bc:18.3f}")
    for label, key, base_v, plan_v, goal in (
        ("mixture_error 10-step window", "window", b_mix[0], plan_me.window, GOAL_WINDOW),
        ("mixture_error phase", "phase", b_mix[1], plan_me.phase, GOAL_PHASE),
    ):
        print(f"{label:28s}{weir[key]:12.4f}{by_length[key]:13.4f}{base_v:18.4f}   (plan {plan_v:.4f}; goal ≤ {goal})")
    print(
        f"one document in a window: {spread_share:.4f} (its pieces spread over the draw order), "
        f"{consecutive_share:.4f} (consecutive): the largest share of any one document in any 10-step window"
    )
    print(f"same packing as the reference packer, unit for unit (with and without the choice): {same}; weir's "
          f"figures match inspect_build of its shards: {shards_agree}")  # fmt: skip
    print(f"\npacking throughput, {n_units:,} units, best of {args.repeat}:")
    print(f"  weir ({engine:8s})       {n_units / new_s:12,.0f} documents/s  ({new_s:.3f} s; "
          f"{old_s / new_s:.1f}× the reference)")  # fmt: skip
    print(f"  weir by length ({engine:8s}){n_units / by_len_s:9,.0f} documents/s  ({by_len_s:.3f} s)")
    print(f"  CPU time, best of {args.repeat}: weir {new_cpu:.3f} s ({n_units / new_cpu:,.0f} documents/s), by length "
          f"{by_len_cpu:.3f} s ({n_units / by_len_cpu:,.0f}/s): the choice costs {new_cpu / by_len_cpu - 1:+.1%} "
          f"(wall: {new_s / by_len_s - 1:+.1%})")  # fmt: skip
    if engine != "python":
        print(f"  weir (python, 1 run)     {n_units / py_s:12,.0f} documents/s  ({py_s:.3f} s; numba not installed)")
    print(f"  reference (pure Python)  {n_units / old_s:12,.0f} documents/s  ({old_s:.3f} s)")
    print(f"  first call in a process  {first_call:.3f} s (loads or compiles the numba kernels)")
    result = packing.segments.nbytes + packing.dropped.nbytes + packing.seg_offsets.nbytes + packing.seq_step.nbytes
    print(f"peak memory while packing (tracemalloc): weir {new_peak / 2**20:,.1f} MiB "
          f"= {new_peak / n_units:,.0f} B/unit "
          f"(the result {result / 2**20:,.1f} MiB; the rest is bounded by --chunk-units, not the plan), "
          f"the reference {old_peak / 2**20:,.1f} MiB = {old_peak / n_units:,.0f} B/unit")  # fmt: skip
    print("stage wall times (s):")
    for k, v in times.items():
        print(f"  {k:30s}{v:8.2f}")
    print(f"load average (1, 5, 15 min): before {load_before}, after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
