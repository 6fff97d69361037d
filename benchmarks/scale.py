"""Outgrowing one machine: a build's stages on the local engine and on Ray with 1 and 2 workers, on one corpus.

    python benchmarks/scale.py --quick                   # ~80 MB corpus: a sanity check (~3 min on 2 cores)
    python benchmarks/scale.py                           # ~1 GB corpus: the figures in docs/scale.md (~17 min)
    python benchmarks/scale.py --data /tmp/scale-1gb     # keep the corpus there (reused when it exists)
    python benchmarks/scale.py --mb 2000 --memory        # only the ray×2 driver's memory, at 1 and 2 GB (~4 min)

The corpus (``--mb`` MB of files) is 8 equal parts, each with three sources: ``prose`` (the synthetic prose
documents of :mod:`mixing.ingest.synthetic` as ``{"text": ...}`` records in ~1 MB jsonl files, 1/2 of the
bytes), ``qa`` (its question/answer records rendered by a template, ~1 MB jsonl files, 1/4) and ``code``
(the standard library's ``.py`` files, one document each, 1/4). The tokenizer is tiktoken ``o200k_base``,
read offline from ``../shared/tokenizers/tiktoken_cache``; without it (or with ``--tokenizer bpe``) a
byte-level BPE the build trains on the corpus, said so in the output. The mix plans 0.2 tokens per input
byte (about 0.6 epoch of this corpus) in one phase at S=8192, 64 sequences a step.

Each configuration is a fresh process, the driver, that runs every stage of :data:`mixing.stages.STAGES`
(``Stage.run_ahead``, then ``Stage.run`` per partition: what ``weir build`` runs, without Dagster) into a fresh build
folder, so no chunk is reused:

- ``local``: the local engine with one tokenizer thread (``RAYON_NUM_THREADS=1``): one worker's work, in process;
- ``ray×1``: a Ray cluster of one node with 1 CPU on 127.0.0.1, started by the driver before the stages;
- ``ray×2``: the same with two nodes of 1 CPU each;
- ``ray×1, threads=cores``: ``ray×1`` with ``RAYON_NUM_THREADS`` = cores in the cluster's environment, so each
  worker runs as many tokenizer threads as the machine has cores (what workers did before ``mixing.engine``
  sized them to the task's CPUs), up to ``documents``;
- ``local, all cores``: the local engine as ``weir build`` runs it (tokenizer threads = cores), up to ``documents``;
- ``local`` and ``ray×2`` again on parts 0–3 alone (half of the corpus): the driver's peak memory at two sizes, both
  large enough to fill the packer's blocks of units.

Figures. Tokenize throughput: the records' text (UTF-8 MB) ÷ the wall seconds of the ``documents`` stage over
every source (the whole stage: chunk listing, task submission, Ray workers starting on first use, the document
index); each of ``local``, ``ray×1``, ``ray×2`` runs twice, in the order local, ray×1, ray×2, ray×2, ray×1,
local (the second runs up to ``documents``), so that a drift of the shared machine's speed over the runs cancels
to first order out of the ratios ray×2 / ray×1 (goal ≥ 1.7) and ray×1 / local (goal ≥ 0.85), computed over both
runs of each; printed with the most two workers could gain given the chunks (every source's chunks in one
queue to the first free worker, time in proportion to MB).
CPU-seconds per GB of input files, per stage: the driver's (``time.process_time``, every thread of the driver
process, less this benchmark's polling) and, on Ray, every process of the cluster, polled with psutil every
0.2 s (user + system; the ``ray::`` worker processes apart from Ray's daemons: GCS, raylets, agents), so a
process that exits loses at most its last 0.2 s. Memory, polled every 0.2 s, the largest in each stage: the
driver's anonymous memory (RSS less file-backed and shared pages: memory-mapped token files are the page
cache's) at both sizes, with ``ru_maxrss`` (all of its RSS, the cluster's processes not included) of the whole
run, and the largest Ray worker's RSS and anonymous memory; beside them, the documents of the largest chunk (the
driver writes a source's index one chunk at a time) and DuckDB's ``memory_limit`` (``WEIR_DUCKDB_MEMORY_LIMIT``).
Every run prints the 1-minute load average before → after it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages: run as a script, only this folder is on the path
SHARED = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()), None)
TIKTOKEN_CACHE = SHARED / "tokenizers" / "tiktoken_cache" if SHARED else None

from benchmarks.sampler import MEMORY, Sampler
from benchmarks.scale_corpus import chunk_bound, chunk_sizes, largest_chunk_docs, write_corpus, write_mix

CONFIGS = {  # name: (ray nodes, last stage, corpus part glob, label)
    "local": (0, "packed_shards", "*", "local"),
    "ray1": (1, "packed_shards", "*", "ray×1"),
    "ray2": (2, "packed_shards", "*", "ray×2"),
    # the same three again in reverse order, up to documents: throughput over both runs of each (ABBA), so a
    # drift of the shared machine's speed during the runs cancels out of the ratios
    "ray2-b": (2, "documents", "*", "ray×2, again"),
    "ray1-b": (1, "documents", "*", "ray×1, again"),
    "local-b": (0, "documents", "*", "local, again"),
    "ray1-cores": (1, "documents", "*", "ray×1, threads=cores"),
    "local-all": (0, "documents", "*", "local, all cores"),
    "local-half": (0, "packed_shards", "[0-3]", "local"),
    "ray2-half": (2, "packed_shards", "[0-3]", "ray×2"),
}


def _load() -> float:
    return os.getloadavg()[0]


def warm_up(data: Path, tmp: Path, tokenizer: str) -> float:
    """Read every corpus file once (page cache), and build a few files of it in a driver process, so that no
    measured run pays for a cold page cache or for compiling the packer (numba caches it on disk); seconds."""
    t = time.perf_counter()
    for p in sorted(data.rglob("*")):
        if p.is_file():
            p.read_bytes()
    mix = tmp / "mix-warm-up.yaml"
    write_mix(mix, data.resolve(), "0", tokenizer, 2_000_000, files="part-00000", code="0/*.py")
    _spawn("local", mix, tmp / "build-warm-up")
    return time.perf_counter() - t


def drive(config: str, mix_path: Path, work: Path) -> dict[str, Any]:
    """Run the stages of ``config`` (:data:`CONFIGS`) for the mix at ``mix_path`` in build folder ``work``."""
    from mixing import load_mix
    from mixing.engine import LOCAL, Engine, RayEngine
    from mixing.output.layout import BuildLayout
    from mixing.stages import stages_until
    from tests.ray_cluster import LocalRayCluster

    nodes, last, _parts, _label = CONFIGS[config]
    mix = load_mix(mix_path)
    layout = BuildLayout(work)
    out: dict[str, Any] = {"stages": {}, "load_before": _load()}
    with ExitStack() as stack:
        cluster = None
        engine: Engine = LOCAL
        if nodes:
            t = time.perf_counter()
            cluster = stack.enter_context(LocalRayCluster(nodes=nodes))
            ray_engine = RayEngine(cluster.address)
            ray_engine.connect()
            engine = ray_engine
            out["cluster_start_s"] = time.perf_counter() - t
            out["workers"] = engine.workers
        sampler = stack.enter_context(Sampler(cluster))
        out["before"] = sampler.snapshot()
        for stage in stages_until(last):
            before = sampler.snapshot()
            t = time.perf_counter()
            stage.run_ahead(mix, layout, None, engine)  # what weir build does: every source's tasks at once
            results: list[Any] = [stage.run(mix, layout, p, None, engine) for p in stage.partitions(mix)]
            wall = time.perf_counter() - t
            after = sampler.snapshot()
            row = {k: after[k] - before[k] for k in ("driver", "workers", "daemons")}
            row |= {k: after[k] for k in MEMORY} | {"wall": wall, "driver_anon_start": before["driver_anon_now"]}
            if stage.name == "source_index":  # index frames
                out["input_bytes"] = sum(int(df["size"].sum()) for df in results)
                out["files"] = sum(df.height for df in results)
            if stage.name == "documents":  # TokenizeReports
                for key, field in (("text_bytes", "bytes_in"), ("docs", "docs_kept"), ("tokens", "tokens")):
                    out[key] = sum(getattr(r, field) for r in results)
                out["chunks"] = sum(r.chunks for r in results)
                out["chunk_mb"] = chunk_sizes(mix, layout)
                out["largest_chunk_docs"] = largest_chunk_docs(mix, layout)
            if stage.name == "packed_shards":  # the manifest
                out["shards"] = len(results[0].shards)
            out["stages"][stage.name] = row
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["load_after"] = _load()
    return out


def _spawn(config: str, mix_path: Path, work: Path) -> dict[str, Any]:
    """:func:`drive` in a fresh process (its own peak memory; the tokenizer's thread count fixed at start)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # the Ray workers the driver starts import mixing too
    env.pop("RAYON_NUM_THREADS", None)
    if config.startswith("local") and config != "local-all":
        env["RAYON_NUM_THREADS"] = "1"  # one worker's work: one tokenizer thread, as on a 1-CPU Ray worker
    if config == "ray1-cores":  # the cluster's workers inherit it: as many tokenizer threads as cores
        env["RAYON_NUM_THREADS"] = str(os.cpu_count())
    args = [sys.executable, __file__, "--driver", config, str(mix_path), str(work)]
    try:
        run = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if run.returncode:
        raise SystemExit(f"{config} failed:\n{run.stderr[-4000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def _commit() -> str:
    run = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain"], capture_output=True, text=True)
    return run.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


RAY = ("ray1", "ray2")
RAY2 = ("ray2-half", "ray2")  # the driver's memory at two sizes


def _cpu(st: dict[str, float], gb: float) -> str:
    """A Ray run's CPU-seconds per GB of one stage: driver + workers + daemons = total."""
    d, w, s = st["driver"] / gb, st["workers"] / gb, st["daemons"] / gb
    return f"{d:>11.1f} +{w:>6.1f} +{s:>5.1f} ={d + w + s:>7.1f}"


def report(corpus: dict[str, Any], tokenizer: str, runs: dict[str, dict[str, Any]], load0: float) -> None:
    """Print every figure: throughput and ratios, CPU-seconds per GB per stage, wall seconds, peak memory."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"commit {_commit()}, {now}, {os.cpu_count()} cores, load average {load0:.2f} at start")
    full = runs["local"]
    gb = full["input_bytes"] / 1e9
    sources = ", ".join(f"{n} {s['bytes'] / 1e6:,.0f} MB in {s['files']:,} files" for n, s in corpus["sources"].items())
    print(f"corpus: {full['input_bytes'] / 1e6:,.0f} MB ({sources})")
    print(f"  {full['docs']:,} documents, {full['tokens'] / 1e6:,.1f} M tokens ({tokenizer}), {full['chunks']} chunks:")
    for name, sizes in full["chunk_mb"].items():
        big = max(sizes)
        print(f"  {name}: {len(sizes)} chunks, the largest {big:.1f} MB ({big / sum(sizes):.0%} of the source)")

    print("\ntokenize throughput (documents stage, every source):")
    print(f"{'':<22}{'text MB':>9}{'wall s':>9}{'MB/s':>8}{'CPU/wall':>10}   load before → after")
    rate = {}
    for name in ("local", *RAY, "ray2-b", "ray1-b", "local-b", "ray1-cores", "local-all"):
        r = runs[name]
        st = r["stages"]["documents"]
        rate[name] = r["text_bytes"] / 1e6 / st["wall"]
        cpu = (st["driver"] + st["workers"] + st["daemons"]) / st["wall"]
        print(
            f"{CONFIGS[name][3]:<22}{r['text_bytes'] / 1e6:>9,.0f}{st['wall']:>9.1f}{rate[name]:>8.2f}{cpu:>10.2f}"
            f"   {r['load_before']:.2f} → {r['load_after']:.2f}"
        )
    for name in ("local", *RAY):  # both runs of each, in the order local, ray×1, ray×2, ray×2, ray×1, local
        a, b = runs[name], runs[f"{name}-b"]
        rate[name] = (a["text_bytes"] + b["text_bytes"]) / 1e6 / sum(r["stages"]["documents"]["wall"] for r in (a, b))
    print("over both runs of each (ABBA):", ", ".join(f"{CONFIGS[n][3]} {rate[n]:.2f} MB/s" for n in ("local", *RAY)))
    r21, r1l = rate["ray2"] / rate["ray1"], rate["ray1"] / rate["local"]
    bound = chunk_bound(full["chunk_mb"], 2)
    ok = "ok" if r21 >= 1.7 else "BELOW GOAL"
    print(f"ray×2 / ray×1 = {r21:.2f} (goal ≥ 1.7: {ok}; these chunks allow {bound:.2f} at most, with no other cost)")
    print(f"ray×1 / local = {r1l:.2f} (goal ≥ 0.85: {'ok' if r1l >= 0.85 else 'BELOW GOAL'})")
    print(f"ray×2 / local, all cores = {rate['ray2'] / rate['local-all']:.2f}")
    cpu = {n: runs[n]["stages"]["documents"]["workers"] / gb for n in ("ray1", "ray1-cores")}
    print(
        f"ray×1, one tokenizer thread per worker CPU (the engine's) / as many as cores = "
        f"{rate['ray1'] / rate['ray1-cores']:.2f}; worker CPU-s per GB {cpu['ray1']:.1f} vs {cpu['ray1-cores']:.1f}"
    )

    print(f"\nCPU-seconds per GB of input ({gb:.3f} GB; Ray: driver + workers + daemons = total), and wall seconds:")
    head = "".join(f"{CONFIGS[n][3] + ' drv + wrk + dmn = total':>34}" for n in RAY)
    print(f"{'stage':<15}{'local':>8}{head}{'wall s: local':>16}{'ray×1':>8}{'ray×2':>8}")
    total = {n: dict.fromkeys(("wall", "driver", "workers", "daemons"), 0.0) for n in ("local", *RAY)}
    for stage in full["stages"]:
        for n, t in total.items():
            for k in t:
                t[k] += runs[n]["stages"][stage][k]
        rows = [runs[n]["stages"][stage] for n in ("local", *RAY)]
        walls = f"{rows[0]['wall']:>16.1f}{rows[1]['wall']:>8.1f}{rows[2]['wall']:>8.1f}"
        print(f"{stage:<15}{rows[0]['driver'] / gb:>8.1f}{_cpu(rows[1], gb)}{_cpu(rows[2], gb)}{walls}")
    walls = f"{total['local']['wall']:>16.1f}{total['ray1']['wall']:>8.1f}{total['ray2']['wall']:>8.1f}"
    print(
        f"{'total':<15}{total['local']['driver'] / gb:>8.1f}{_cpu(total['ray1'], gb)}{_cpu(total['ray2'], gb)}{walls}"
    )
    for n in RAY:
        print(f"{CONFIGS[n][3]}: cluster started in {runs[n]['cluster_start_s']:.1f} s before the stages (not counted)")

    print("\nmemory (MB), the largest polled in each stage; anon: RSS less file-backed and shared pages (mapped")
    print("token files, Ray's object store); the driver's anon at both sizes, and ru_maxrss (all its RSS) of the run:")
    configs = [n + x for n in ("local", "ray2") for x in ("-half", "")]
    head = "".join(f"{CONFIGS[n][3] + ': half':>17}{'all':>11}" for n in ("local", "ray2"))
    print(f"{'':<15}{head}{'ray×2 B/doc':>13}{'Ray worker rss, anon':>22}")
    docs = {n: runs[n]["docs"] for n in configs}
    print(
        f"{'documents':<15}"
        + "".join(f"{docs[n]:>17,}" if i % 2 == 0 else f"{docs[n]:>11,}" for i, n in enumerate(configs))
    )
    largest = {n: runs[n]["largest_chunk_docs"] for n in configs}
    print(
        f"{'largest chunk':<15}"
        + "".join(f"{largest[n]:>17,}" if i % 2 == 0 else f"{largest[n]:>11,}" for i, n in enumerate(configs))
    )
    limit = os.environ.get("WEIR_DUCKDB_MEMORY_LIMIT") or "2GB (default)"
    print(f"(documents: the driver reads a chunk's document list 64 Ki rows at a time; DuckDB's memory_limit: {limit})")
    big, small = runs["ray2"], runs["ray2-half"]
    span = (big["docs"] - small["docs"]) / 2**20  # bytes per document from MB per Mi-documents
    rows = [("before stages", {n: runs[n]["before"] for n in configs})]
    rows += [(stage, {n: runs[n]["stages"][stage] for n in configs}) for stage in full["stages"]]
    for what, mem in rows:
        cells = "".join(f"{mem[n]['driver_anon']:>{11 if i % 2 else 17}.0f}" for i, n in enumerate(configs))
        per_doc = (mem["ray2"]["driver_anon"] - mem["ray2-half"]["driver_anon"]) / span
        worker = f"{mem['ray2']['worker_rss']:>15.0f}, {mem['ray2']['worker_anon']:>5.0f}" if what != rows[0][0] else ""
        print(f"{what:<15}{cells}{per_doc:>13.0f}{worker}")
    cells = "".join(f"{runs[n]['peak_rss_mb']:>{11 if i % 2 else 17}.0f}" for i, n in enumerate(configs))
    per_doc = (big["peak_rss_mb"] - small["peak_rss_mb"]) / span
    print(f"{'ru_maxrss':<15}{cells}{per_doc:>13.0f}")
    report_driver_memory(runs)


def report_driver_memory(runs: dict[str, dict[str, Any]]) -> None:
    """The ray×2 driver at half and all of the corpus: its anon memory per stage, and each stage's own growth."""
    half, full = (runs[n] for n in RAY2)
    print(f"the ray×2 driver, MB at half → all of the corpus ({half['docs']:,} → {full['docs']:,} documents):")
    print(f"{'stage':<15}{'peak anon':>19}{'own growth':>19}   (own: its peak less the anon it began with)")
    for stage in full["stages"]:
        a, b = half["stages"][stage], full["stages"][stage]
        own = (a["driver_anon"] - a["driver_anon_start"], b["driver_anon"] - b["driver_anon_start"])
        print(f"{stage:<15}{a['driver_anon']:>10.0f} → {b['driver_anon']:>5.0f}{own[0]:>11.0f} → {own[1]:>5.0f}")
    print(f"{'ru_maxrss':<15}{half['peak_rss_mb']:>10.0f} → {full['peak_rss_mb']:>5.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=1000.0, help="MB of input files (default 1000)")
    ap.add_argument("--quick", action="store_true", help="80 MB: a sanity check")
    ap.add_argument("--data", type=Path, help="the corpus folder: written there unless it holds one already")
    ap.add_argument("--tokenizer", choices=("tiktoken", "bpe"), help="default: tiktoken when its cache is here")
    ap.add_argument("--memory", action="store_true", help="only the ray×2 driver's memory at half and all the corpus")
    ap.add_argument("--driver", nargs=3, metavar=("CONFIG", "MIX", "WORK"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.driver:
        print(json.dumps(drive(a.driver[0], Path(a.driver[1]), Path(a.driver[2]))))
        return

    from tests.ray_cluster import RAY_ENV

    os.environ.update(RAY_ENV)  # before any driver imports ray (tests/ray_cluster.py)
    tokenizer = a.tokenizer
    if tokenizer is None:
        have = TIKTOKEN_CACHE is not None and TIKTOKEN_CACHE.is_dir()
        tokenizer = "tiktoken" if have else "bpe"
        if not have:
            print("../shared/tokenizers/tiktoken_cache is not here: a BPE trained by the build instead of o200k_base")
    if tokenizer == "tiktoken":
        if TIKTOKEN_CACHE is None or not TIKTOKEN_CACHE.is_dir():
            raise SystemExit("--tokenizer tiktoken needs ../shared/tokenizers/tiktoken_cache (no network here)")
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(TIKTOKEN_CACHE))
    mb = 80.0 if a.quick else a.mb
    load0 = _load()
    with tempfile.TemporaryDirectory(prefix="weir-scale-") as d:
        tmp = Path(d)
        data = a.data or tmp / "data"
        corpus = write_corpus(data, mb)
        print(f"corpus {data}: {corpus['mb']:,.0f} MB (written in {corpus['seconds']:.0f} s, or before)")
        total = sum(s["bytes"] for s in corpus["sources"].values())
        print(f"warm-up (page cache, packer compiled): {warm_up(data, tmp, tokenizer):.0f} s", flush=True)
        runs: dict[str, dict[str, Any]] = {}
        for config, (_nodes, _last, parts, label) in CONFIGS.items():
            if a.memory and config not in RAY2:
                continue
            mix = tmp / f"mix-{parts}.yaml"
            write_mix(mix, data.resolve(), parts, tokenizer, total // (2 if parts == "[0-3]" else 1))
            t = time.perf_counter()
            runs[config] = _spawn(config, mix, tmp / f"build-{config}")
            r = runs[config]
            print(
                f"  ran {config} ({label}, parts {parts}) in {time.perf_counter() - t:.0f} s, "
                f"load {r['load_before']:.2f} → {r['load_after']:.2f}",
                flush=True,
            )
        print()
        if a.memory:
            now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
            print(f"commit {_commit()}, {now}, {os.cpu_count()} cores, load average {load0:.2f} at start")
            report_driver_memory(runs)
            return
        report(corpus, "tiktoken o200k_base" if tokenizer == "tiktoken" else "trained BPE, 32768", runs, load0)


if __name__ == "__main__":
    main()
