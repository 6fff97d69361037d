"""Time and peak memory of length statistics, the curriculum plan and packing over synthetic document lengths.

Usage: ``python benchmarks/plan.py`` (1M and 3M documents), ``--big`` (1M and 10M), ``--docs 1000000 20000000``;
``--memory-limit 4GB --threads 2`` bound DuckDB in the plan stage (it spills past the limit); packing is
timed up to ``--pack-up-to`` documents (the packer holds every unit of the plan in memory).

Synthetic documents: three sources with log-normal lengths (a long tail past S), written straight into a
DuckDB ``documents`` table (tokenizing is not what is timed), generated 10M at a time. The mix has a
length-limited warmup, a main phase ramped in linearly and a cosine-ramped anneal of 15% of the steps;
phases are sized in tokens so the plan draws about 90% of all tokens.

Each stage runs in its own child process (``stats``: ``length_tables``; ``plan``: ``make_plan``; ``pack``:
``mixing.pack.packing.pack_plan``, the packer's public entry point; ``fit``: ``make_plan`` with the probe a
build's plan stage passes, :func:`mixing.pack.whole_drops.whole_drops`, which packs each plan drawn and draws it
again until the packing drops no document whole: its time beside ``plan``'s is what the fit costs; ``plans``:
the plans drawn, ``left``: the units starting a document that the first plan's packing drops → the fitted's)
and reports its wall time and its own peak resident memory (``ru_maxrss``), so one stage's memory never hides
another's. Prints the load average beside the figures, each stage's CPU seconds (user + system, all threads:
less sensitive to the load than wall time), and per size the stats + plan time ratio to the previous size over
the size ratio (1.0: linear).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Import this checkout's packages, not whichever one the environment was installed from.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import argparse
import json
import os
import resource
import subprocess
import tempfile
import time
from typing import TYPE_CHECKING

import duckdb
import numpy as np
import pyarrow as pa

if TYPE_CHECKING:
    from mixing.mixfile.mix import Mix

SEQ, BATCH = 4096, 256
CHUNK = 10_000_000  # documents generated at a time

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
    """Create ``documents(source, doc_id, n_tokens)`` with ``n`` log-normal lengths; return the tokens.

    Generated ``CHUNK`` documents at a time from one generator (up to ``CHUNK`` the same documents as a
    single draw), so memory stays bounded at any size.
    """
    rng = np.random.default_rng(seed)
    names = np.array(["web", "code", "math"])
    next_id = dict.fromkeys(names.tolist(), 0)
    con.execute("CREATE OR REPLACE TABLE documents (source VARCHAR, doc_id BIGINT, n_tokens BIGINT)")
    tokens = 0
    for a in range(0, n, CHUNK):
        m = min(CHUNK, n - a)
        src = rng.choice(names, size=m, p=[0.6, 0.25, 0.15])
        lens = np.clip(rng.lognormal(6.0, 1.1, m), 1, 200_000).astype(np.int64)
        doc_id = np.zeros(m, np.int64)
        for s in next_id:
            mask = src == s
            k = int(mask.sum())
            doc_id[mask] = np.arange(next_id[s], next_id[s] + k)
            next_id[s] += k
        con.register("docs_in", pa.table({"source": src, "doc_id": doc_id, "n_tokens": lens}))
        con.execute("INSERT INTO documents SELECT * FROM docs_in")
        con.unregister("docs_in")
        tokens += int(lens.sum())
    return tokens


def bench_mix(tokens: int) -> Mix:
    from mixing.mixfile.mix import parse_mix

    # web is 60% of documents and of the mixture: budget ~90% of its tokens over the run.
    run_tokens = int(tokens * 0.9)
    return parse_mix(MIX.format(seq=SEQ, batch=BATCH, warm=run_tokens // 20, main=run_tokens * 65 // 100))


def stage(name: str, db: Path, n: int, tokens: int, config: dict[str, str | int]) -> dict[str, float]:
    """Run one stage in this process; return its seconds (and what it reports)."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()
    if name == "setup":
        with duckdb.connect(str(db)) as con:
            out["tokens"] = synthetic_documents(con, n)
    elif name == "stats":
        from mixing.plan.stats import length_tables

        with duckdb.connect(str(db), config=dict(config)) as con:
            length_tables(con, SEQ)
    elif name == "plan":
        from mixing.plan.curriculum_plan import make_plan

        out["units"] = make_plan(bench_mix(tokens), db, config=config).units
    elif name == "pack":
        from mixing.pack.packing import pack_plan

        out["sequences"] = len(pack_plan(db, SEQ, BATCH).seq_step)
    elif name == "fit":
        from mixing.pack.whole_drops import whole_drops
        from mixing.plan.curriculum_plan import make_plan
        from mixing.plan.fit import Left

        mix, found = bench_mix(tokens), []
        probe = whole_drops(mix)

        def counting(path: Path) -> list[Left]:
            found.append(len(left := probe(path)))
            return left

        out["units"] = make_plan(mix, db, config=config, probe=counting).units
        out["seconds"] = time.perf_counter() - t0
        out["plans"] = len(found)  # each plan drawn is probed once
        out["left_first"], out["left_fitted"] = found[0], found[-1]
        return out
    out["seconds"] = time.perf_counter() - t0
    return out


def child(name: str, db: Path, n: int, tokens: int, config: dict[str, str | int]) -> dict[str, float]:
    """Run ``stage`` in a fresh Python process; add its peak resident memory in bytes."""
    cmd = [sys.executable, __file__, "--stage", name, str(db), str(n), str(tokens), json.dumps(config)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.exit(f"stage {name} at {n:,} documents failed:\n{proc.stderr[-3000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, nargs="+", help="document counts to time (default 1M 3M)")
    ap.add_argument("--big", action="store_true", help="time 1M and 10M documents")
    ap.add_argument("--memory-limit", default="4GB", help="DuckDB memory_limit in the stats and plan stages")
    ap.add_argument("--threads", type=int, default=2, help="DuckDB threads in the stats and plan stages")
    ap.add_argument("--pack-up-to", type=int, default=1_000_000, help="time packing up to this many documents")
    ap.add_argument("--fit-up-to", type=int, default=3_000_000, help="time the fitted plan up to this many documents")
    ap.add_argument("--stage", nargs=5, metavar=("NAME", "DB", "N", "TOKENS", "CONFIG"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stage:
        name, db, n, tokens, stage_config = args.stage
        out = stage(name, Path(db), int(n), int(tokens), json.loads(stage_config))
        ru = resource.getrusage(resource.RUSAGE_SELF)
        out["rss"] = ru.ru_maxrss * 1024  # Linux: KiB
        out["cpu"] = ru.ru_utime + ru.ru_stime  # all threads: what the stage costs whatever the load
        print(json.dumps(out))
        return
    sizes = args.docs or ([1_000_000, 10_000_000] if args.big else [1_000_000, 3_000_000])
    config: dict[str, str | int] = {"memory_limit": args.memory_limit, "threads": args.threads}
    print(f"DuckDB {config}; {os.cpu_count()} cores; seconds and peak RSS (GB) per stage, each its own process")
    print(
        f"{'documents':>12} {'units':>12} {'stats s':>8} {'cpu s':>7} {'GB':>5} {'plan s':>8} {'cpu s':>7} {'GB':>5} "
        f"{'pack s':>8} {'cpu s':>7} {'GB':>5} {'fit s':>8} {'cpu s':>7} {'GB':>5} {'plans':>5} {'left':>9} "
        f"{'time/size':>9}  load avg"
    )
    prev: tuple[int, float] | None = None
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            db = Path(tmp) / "weir.duckdb"
            tokens = int(child("setup", db, n, 0, config)["tokens"])
            load = "/".join(f"{x:.1f}" for x in os.getloadavg())
            st = child("stats", db, n, tokens, config)
            pl_ = child("plan", db, n, tokens, config)
            pk = child("pack", db, n, tokens, config) if n <= args.pack_up_to else None
            ft = child("fit", db, n, tokens, config) if n <= args.fit_up_to else None
            load += " → " + "/".join(f"{x:.1f}" for x in os.getloadavg())
        total = st["seconds"] + pl_["seconds"]
        growth = f"{(total / prev[1]) / (n / prev[0]):>9.2f}" if prev else f"{'':>9}"
        prev = (n, total)
        pack = (
            f"{pk['seconds']:>8.2f} {pk['cpu']:>7.1f} {pk['rss'] / 1e9:>5.2f}" if pk else f"{'-':>8} {'-':>7} {'-':>5}"
        )
        fit = (
            f"{ft['seconds']:>8.2f} {ft['cpu']:>7.1f} {ft['rss'] / 1e9:>5.2f} {int(ft['plans']):>5} "
            f"{int(ft['left_first']):>4}→{int(ft['left_fitted']):<4}"
            if ft
            else f"{'-':>8} {'-':>7} {'-':>5} {'-':>5} {'-':>9}"
        )
        print(
            f"{n:>12,} {int(pl_['units']):>12,} {st['seconds']:>8.2f} {st['cpu']:>7.1f} {st['rss'] / 1e9:>5.2f} "
            f"{pl_['seconds']:>8.2f} {pl_['cpu']:>7.1f} {pl_['rss'] / 1e9:>5.2f} {pack} {fit} {growth}  {load}",
            flush=True,
        )


if __name__ == "__main__":
    main()
