"""Time length statistics and the curriculum plan over synthetic document lengths.

Usage: ``python benchmarks/plan.py`` (1M documents, then 3M), ``--big`` (1M and 10M, the issue's figures;
needs a few GB of memory), or ``--docs 1000000 2000000``.

Synthetic documents: three sources with log-normal lengths (a long tail past S), written straight into a
DuckDB ``documents`` table (tokenizing is not what is timed). The mix has a length-limited warmup, a main
phase ramped in linearly and a cosine-ramped anneal of 15% of the steps; phases are sized in tokens so the
plan draws about 90% of all tokens (the planner's work grows with the documents it must order and assign).
Prints seconds for stats and plan per size, and the ratio to the smallest size beside the ratio of sizes
(linear growth: the two ratios match).
"""

from __future__ import annotations

import sys
from pathlib import Path

# This folder holds tokenize.py (the tokenizer benchmark): run as a script, it would shadow the standard
# library's tokenize for every module imported below, so take this folder off the import path first.
if Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import tempfile
import time

import duckdb
import numpy as np
import pyarrow as pa

from mixing.mixfile import parse_mix
from mixing.plan import make_plan
from mixing.stats import length_tables

SEQ, BATCH = 4096, 256

MIX = """\
name: bench
seed: 1
sequence: {{length: {seq}, global_batch: {batch}}}
sources:
  web:  {{uri: "-", max_epochs: 1}}
  code: {{uri: "-", max_epochs: 1}}
  math: {{uri: "-", max_epochs: 2}}
curriculum:
  - {{phase: warmup, tokens: {warm}, mixture: {{web: 0.6, code: 0.3, math: 0.1}}, max_doc_tokens: 1024}}
  - phase: main
    tokens: {main}
    mixture: {{web: 0.6, code: 0.25, math: 0.15}}
    transition: {{shape: linear, steps: 20}}
  - phase: anneal
    steps: 15%
    mixture: {{web: 0.4, code: 0.3, math: 0.3}}
    transition: {{shape: cosine, steps: 10}}
"""


def synthetic_documents(con: duckdb.DuckDBPyConnection, n: int, seed: int = 0) -> int:
    """Create ``documents(source, doc_id, n_tokens)`` with ``n`` log-normal lengths; return the tokens."""
    rng = np.random.default_rng(seed)
    src = rng.choice(np.array(["web", "code", "math"]), size=n, p=[0.6, 0.25, 0.15])
    lens = np.clip(rng.lognormal(6.0, 1.1, n), 1, 200_000).astype(np.int64)
    doc_id = np.zeros(n, np.int64)
    for s in ("web", "code", "math"):
        m = src == s
        doc_id[m] = np.arange(int(m.sum()))
    con.register("docs_in", pa.table({"source": src, "doc_id": doc_id, "n_tokens": lens}))
    con.execute("CREATE OR REPLACE TABLE documents AS SELECT * FROM docs_in")
    con.unregister("docs_in")
    return int(lens.sum())


def run(n: int) -> tuple[float, float, int]:
    """Seconds for stats and for the plan over ``n`` synthetic documents, and the units planned."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "weir.duckdb"
        with duckdb.connect(str(db)) as con:
            tokens = synthetic_documents(con, n)
            t0 = time.perf_counter()
            length_tables(con, SEQ)
            t_stats = time.perf_counter() - t0
        # web is 60% of documents and of the mixture: budget ~90% of its tokens over the run.
        run_tokens = int(tokens * 0.9)
        mix = parse_mix(MIX.format(seq=SEQ, batch=BATCH, warm=run_tokens // 20, main=run_tokens * 65 // 100))
        t0 = time.perf_counter()
        plan = make_plan(mix, db)
        t_plan = time.perf_counter() - t0
    return t_stats, t_plan, plan.units


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, nargs="+", help="document counts to time (default 1M 3M)")
    ap.add_argument("--big", action="store_true", help="time 1M and 10M documents (the issue's figures)")
    args = ap.parse_args()
    sizes = args.docs or ([1_000_000, 10_000_000] if args.big else [1_000_000, 3_000_000])
    print(f"{'documents':>12} {'units':>12} {'stats s':>9} {'plan s':>9} {'total s':>9} {'size ×':>7} {'time ×':>7}")
    base: tuple[int, float] | None = None
    for n in sizes:
        t_stats, t_plan, units = run(n)
        total = t_stats + t_plan
        base = base or (n, total)
        print(
            f"{n:>12,} {units:>12,} {t_stats:>9.2f} {t_plan:>9.2f} {total:>9.2f} "
            f"{n / base[0]:>7.1f} {total / base[1]:>7.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
