"""``loader_tokens_per_s`` per rank from page cache: weir's PackedDataset (full items, the peers' payload,
cp=2 and cp=4) beside a raw ``np.memmap`` copy (the ceiling) and peers reading the same packed tokens
(LitData ``StreamingDataset`` + ``TokensLoader``, megatron-core's ``IndexedDataset``), plus the sampler's
planning time per step against a stated, plausible training step, and what shard verification
(``loaders.integrity``) costs: steady-state tokens/s verified vs ``verify=False`` side by side, and a fresh
dataset's time to its first item and first-pass tokens/s, unverified, verified with no verdict on the node
yet (every file hashed) and verified with the node's verdicts cached. Timings print the load average.

Provenance (``loaders.PROVENANCE_FIELDS``, opt-in) off and on, side by side: each payload read without and
with provenance fields by readers over the same build, taking turns round by round (the order reversed every
other round), each round's on/off ratio kept; printed per pair: the best tokens/s off and on, their ratio, the
median of the rounds' ratios, and that median by CPU time (goal: on within 1 % of off, i.e. ≥ 0.99).
``--provenance-only`` runs that section alone; ``benchmarks/loader_provenance.py`` sets the loader of a commit
before provenance existed beside them.

Peers run in a separate venv (``--peer-python``; their pins need not match ours) through
``benchmarks/loader_peers.py``; without one they are reported as not measured. Every reader delivers
int64 torch tensors, single process (``num_workers=0``), after one warm-up pass so the files are in page
cache; each row says which arrays it writes per sequence.

    .venv/bin/python benchmarks/loader.py [--build build/demo] [--peer-python build/peer/bin/python]
    .venv/bin/python benchmarks/loader.py --provenance-only --repeat 15

The peer venv (it borrows this venv's torch and numpy through a .pth file, so no other torch is pulled)::

    python3 -m venv build/peer
    build/peer/bin/pip install --no-deps litdata==0.2.76 megatron-core==0.16.1 lightning-utilities
    echo "$PWD/.venv/lib/python3.11/site-packages" > build/peer/lib/python3.11/site-packages/weir-venv.pth
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.loader_provenance import PAIRS
from contract.shards import ShardSet
from loaders import FIELDS, PROVENANCE_FIELDS, PackedDataset, Payload, Reading, World
from loaders.balance import assign_ranks, regroup_window
from loaders.refinement import refine_steps
from mixing.output.shard_writer import write_shards


def timed(fn, repeat: int, min_s: float = 0.5) -> float:
    """Best-of-``repeat`` tokens/s of ``fn`` (which returns the tokens it delivered), each sample running
    ``fn`` again until ``min_s`` seconds have passed, after one warm-up run (page cache, plans)."""
    return interleaved({"fn": fn}, repeat, min_s)["fn"]


def interleaved(fns: dict, repeat: int, min_s: float = 0.5) -> dict[str, float]:
    """:func:`timed` for several readers taking turns (round ``r`` samples each once), so that load from
    other jobs on a shared machine falls on all of them alike."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, 0.0)
    for _ in range(repeat):
        for name, fn in fns.items():
            n, t0 = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - t0) < min_s:
                n += fn()
            best[name] = max(best[name], n / elapsed)
    return best


def raw_memmap(shards: ShardSet) -> int:
    n = 0
    for shard in shards.manifest.shards:
        arr = np.load(shards.dir / shard.files.tokens.name, mmap_mode="r")
        for row in arr:
            n += torch.from_numpy(row.astype(np.int64)).numel()
    return n


LEAN = ("input_ids", "cu_seqlens")  # the peers' payload (plus the document boundaries they lack)


def weir(
    build: Path,
    cp_size: int,
    cp_rank: int,
    fields: tuple[str, ...] | None = None,
    planned: bool = True,
    verify: bool = True,
    cache: Path | None = None,
):
    """A reader over one PackedDataset built once. ``planned``: its steps' plans are kept (each reader has
    its own cache: the readers take turns, and the planner's shared cache holds 64 steps), so passes time
    reading only, planning being timed apart in main; else every pass plans its steps again. ``verify``:
    shard files checked against the manifest (verdicts under ``cache``), as training does by default."""
    ds = PackedDataset(
        build,
        world=World(0, 1, cp_rank, cp_size),
        payload=Payload(fields=fields),
        reading=Reading(verify=verify, cache_dir=cache),
    )
    start = ds.state_dict()
    plan = functools.partial(type(ds.planner).assignment.__wrapped__, ds.planner)  # the uncached planner
    kept = functools.lru_cache(maxsize=None)(plan)

    def read() -> int:
        ds.planner.assignment = kept if planned else functools.lru_cache(maxsize=None)(plan)
        ds.load_state_dict(start)
        return sum(int(item["input_ids"].numel()) for item in ds)

    return read


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


# (payload, fields off, fields on): loader_provenance.py's, written out there without importing loaders
PROVENANCE_PAIRS = PAIRS
assert {f for _, _, on in PAIRS for f in on} == {*FIELDS, *PROVENANCE_FIELDS}, "the pairs name every field"


def provenance(build: Path, repeat: int, min_s: float = 0.5) -> dict[str, tuple[float, float, float, float]]:
    """Tokens/s of each :data:`PROVENANCE_PAIRS` payload with provenance off and on (cp=1, steps planned once,
    ``verify=False``: item building alone), every reader sampled once per round (a sample: passes over the
    build for ≥ ``min_s`` s, after one warm-up pass each), the rounds' order reversed every other round; prints
    and returns per pair (best off, best on, median over rounds of on/off by wall time, the same by this
    process's CPU time, which other jobs on a shared machine disturb less)."""
    readers: dict[tuple[str, str], Any] = {}
    for name, off, on in PROVENANCE_PAIRS:
        readers[name, "off"] = weir(build, 1, 0, off, verify=False)
        readers[name, "on"] = weir(build, 1, 0, on, verify=False)
    for fn in readers.values():
        fn()
    wall: dict[tuple[str, str], list[float]] = {key: [] for key in readers}
    cpu: dict[tuple[str, str], list[float]] = {key: [] for key in readers}
    before = load()
    for r in range(repeat):
        for key in list(readers)[:: 1 if r % 2 == 0 else -1]:
            n, t0, c0 = 0, time.perf_counter(), time.process_time()
            while (elapsed := time.perf_counter() - t0) < min_s:
                n += readers[key]()
            wall[key].append(n / elapsed)
            cpu[key].append(n / (time.process_time() - c0))
    out = {}
    print(
        f"\nprovenance off and on (cp=1, verify=False, steps planned once; {repeat} interleaved rounds of >= {min_s} s"
        " samples per reader;"
    )
    print(f" {before} before, {load()} after):")
    print(
        f"  {'payload':36} {'off tokens/s':>15} {'on tokens/s':>15} {'on/off best':>12} {'median':>7}"
        f" {'CPU median':>11}"
    )
    for name, _, _ in PROVENANCE_PAIRS:
        a, b = wall[name, "off"], wall[name, "on"]
        median = float(np.median([y / x for x, y in zip(a, b, strict=True)]))
        by_cpu = float(np.median([y / x for x, y in zip(cpu[name, "off"], cpu[name, "on"], strict=True)]))
        out[name] = (max(a), max(b), median, by_cpu)
        print(f"  {name:36} {max(a):15,.0f} {max(b):15,.0f} {max(b) / max(a):12.3f} {median:7.3f} {by_cpu:11.3f}")
    print("  (goal: on within 1 % of off, on/off >= 0.99)")
    return out


def first_pass(build: Path, verify: bool, cache: Path) -> tuple[float, float]:
    """A fresh dataset (lean fields): seconds from opening it to its first item, and tokens/s of its whole
    first pass, the opening included (files in page cache; ``cache``: where node verdicts are kept)."""
    t0 = time.perf_counter()
    it = iter(
        PackedDataset(
            build, world=World(0, 1), payload=Payload(fields=LEAN), reading=Reading(verify=verify, cache_dir=cache)
        )
    )
    n = int(next(it)["input_ids"].numel())
    first = time.perf_counter() - t0
    n += sum(int(item["input_ids"].numel()) for item in it)
    return first, n / (time.perf_counter() - t0)


def resharded(build: Path, out: Path, shards: int) -> Path:
    """A copy of ``build``'s shards cut into about ``shards`` shards (so that hashing can run ahead of reading)."""
    src = ShardSet(build / "shards")
    offs, segs = src.segments
    tokens = np.concatenate([src.shard_tokens(k) for k in range(len(src.manifest.shards))])
    per = max(1, -(-len(src) // shards))
    write_shards(out / "shards", tokens, src.steps, offs, segs, per, src.manifest.info(), seq_len=tokens.shape[1])
    return out


def verification(build: Path, repeat: int, n_shards: int = 16) -> None:
    """Print what verifying shard files costs a fresh dataset: time to first item and first-pass tokens/s."""
    with tempfile.TemporaryDirectory() as tmp:
        build = resharded(build, Path(tmp) / "build", n_shards)
        m = ShardSet(build / "shards").manifest
        size = sum(f.bytes for s in m.shards for f in s.files.both())
        warm = Path(tmp) / "warm"
        first_pass(build, True, warm)  # the node's verdicts, kept for the "cached" row
        modes = {
            "verify=False": lambda k: first_pass(build, False, warm),
            "verified, no verdict on the node (all hashed)": lambda k: first_pass(build, True, Path(tmp) / f"c{k}"),
            "verified, the node's verdicts cached": lambda k: first_pass(build, True, warm),
        }
        best = {name: (float("inf"), 0.0) for name in modes}
        for k in range(repeat):  # the modes take turns (shared machine)
            for name, fn in modes.items():
                first, rate = fn(k)
                best[name] = (min(best[name][0], first), max(best[name][1], rate))
    print(
        f"\nshard verification, a fresh dataset (fields=input_ids+cu_seqlens; the build cut into {len(m.shards)}"
        f" shards, {size / 2**20:.1f} MiB of files,"
    )
    print(f" page cache; best of {repeat}; {load()}):")
    print(f"  {'':46} {'time to first item':>18} {'first-pass tokens/s':>20}")
    for name, (first, rate) in best.items():
        print(f"  {name:46} {first * 1e3:15.1f} ms {rate:20,.0f}")


def planning(batch: int, dp: int, window: int, period: int = 0, steps: int = 40) -> float:
    """Seconds per step to plan synthetic long-tailed costs as ``loaders.planner`` does (no I/O): regroup
    windows of ``window`` steps (template of ``period`` steps), refine each after the one before it
    (``loaders.refinement``, when ``period`` > 0) and deal every step to ``dp`` ranks."""
    rng = np.random.default_rng(0)
    costs = rng.pareto(1.0, batch * steps) + 1
    src = rng.integers(0, 1000, (batch * steps, 5)).astype(np.float64)
    done = np.zeros((0, 5))
    t0 = time.perf_counter()
    for a in range(0, steps, window):
        sl = slice(a * batch, (a + window) * batch)
        new = regroup_window(costs[sl], src[sl], window, period=period) if window > 1 else np.zeros(batch, int)
        if period and window > 1:
            k = min(period - 1, len(done))
            target = np.concatenate([done[len(done) - k :], src[sl].reshape(window, batch, 5).sum(1)])
            new = refine_steps(costs[sl], src[sl], new, done[len(done) - k :], target, period)
            done = np.concatenate([done, np.stack([src[sl][new == g].sum(0) for g in range(window)])])
        for g in range(window):
            assign_ranks(costs[sl][new == g], dp)
    return (time.perf_counter() - t0) / steps


def step_seconds(tokens_per_rank: int, params: float, mfu: float, peak_tflops: float) -> float:
    """A plausible training step: ``tokens_per_rank`` × 6·``params`` FLOPs ÷ (``mfu`` × peak FLOP/s) (the
    6·N rule leaves out attention FLOPs, which only lengthen the step: the estimate is on the short side)."""
    return tokens_per_rank * 6 * params / (mfu * peak_tflops * 1e12)


PAYLOAD_FULL = "input_ids, labels, position_ids (int64 [S] each), indices, cu_seqlens"
PAYLOAD_LEAN = "input_ids int64 [S] + cu_seqlens"
PAYLOAD_IDS = "input_ids int64 [S]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", type=Path, help="a weir build (default: build the embedded demo into build/bench)")
    ap.add_argument("--peer-python", help="python of a venv with litdata and megatron-core")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=8192, help="S of the demo build made when --build is absent")
    ap.add_argument("--model-params", type=float, default=8e9, help="N of the plausible step's model")
    ap.add_argument("--mfu", type=float, default=0.4, help="model FLOPs utilisation of the plausible step")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="accelerator peak (H100 SXM dense BF16: 989)")
    ap.add_argument("--provenance-only", action="store_true", help="only provenance off vs on (see the docstring)")
    args = ap.parse_args()
    build = args.build
    if build is None:
        build = ROOT / "build" / "bench" / f"demo-{args.seq_len}"
        if not (build / "shards" / "manifest.json").exists():
            data = ROOT / "build" / "bench" / "demo-data"
            weir_cli = [sys.executable, "-m", "pipelines.cli"]
            subprocess.run([*weir_cli, "demo-data", "--out", str(data)], check=True, cwd=ROOT)
            mix = (ROOT / "mixes" / "demo.yaml").read_text().replace("{mix_dir}/../build/demo-data", str(data))
            mix = mix.replace("length: 2048, global_batch: 16", f"length: {args.seq_len}, global_batch: 4")
            (build.parent / f"{build.name}.yaml").write_text(mix)
            subprocess.run(
                [*weir_cli, "build", str(build.parent / f"{build.name}.yaml"), "--out", str(build)],
                check=True,
                cwd=ROOT,
            )
    shards = ShardSet(build / "shards")
    m = shards.manifest
    S = m.seq_len
    print(f"build {build}: {len(shards)} sequences of {S} tokens ({m.dtype}), single process")
    if args.provenance_only:
        provenance(build, args.repeat)
        return
    payload = {
        "raw np.memmap copy (ceiling)": PAYLOAD_IDS,
        "weir cp=1, full item": PAYLOAD_FULL,
        "weir cp=1, fields=input_ids+cu_seqlens": PAYLOAD_LEAN,
        "weir cp=1, fields=input_ids": PAYLOAD_IDS,
        "weir cp=1, input_ids+cu_seqlens, planning included": PAYLOAD_LEAN,
        "weir cp=2, full item (per rank)": PAYLOAD_FULL + " of S/2 slots",
        "weir cp=4, full item (per rank)": PAYLOAD_FULL + " of S/4 slots",
    }
    payload["weir cp=1, full item, verify=False"] = PAYLOAD_FULL
    payload["weir cp=1, fields=input_ids+cu_seqlens, verify=False"] = PAYLOAD_LEAN
    verdicts = tempfile.TemporaryDirectory()  # node verdicts of the verified readers (not the user's cache)
    cache = Path(verdicts.name)
    rows = interleaved(
        {
            "raw np.memmap copy (ceiling)": lambda: raw_memmap(shards),
            "weir cp=1, full item": weir(build, 1, 0, cache=cache),
            "weir cp=1, full item, verify=False": weir(build, 1, 0, verify=False),
            "weir cp=1, fields=input_ids+cu_seqlens": weir(build, 1, 0, LEAN, cache=cache),
            "weir cp=1, fields=input_ids+cu_seqlens, verify=False": weir(build, 1, 0, LEAN, verify=False),
            "weir cp=1, fields=input_ids": weir(build, 1, 0, ("input_ids",)),
            "weir cp=1, input_ids+cu_seqlens, planning included": weir(build, 1, 0, LEAN, planned=False),
            "weir cp=2, full item (per rank)": weir(build, 2, 0),
            "weir cp=4, full item (per rank)": weir(build, 4, 0),
        },
        args.repeat,
    )
    if args.peer_python:
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                [
                    args.peer_python,
                    str(ROOT / "benchmarks" / "loader_peers.py"),
                    tmp,
                    str(args.repeat),
                    *(str(shards.dir / s.files.tokens.name) for s in m.shards),
                ],
                capture_output=True,
                text=True,
            )
            for line in proc.stdout.splitlines():
                if line.startswith("PEER\t"):
                    _, name, value = line.split("\t")
                    rows[name] = float(value)
                    payload[name] = PAYLOAD_IDS
            errors = [ln for ln in proc.stderr.splitlines() if " failed: " in ln]
            if proc.returncode or errors:
                print(f"peer run (exit {proc.returncode}): {errors or proc.stderr[-800:]}")
    else:
        rows["peers (LitData, megatron-core)"] = float("nan")
        payload["peers (LitData, megatron-core)"] = PAYLOAD_IDS
        print("peers not measured: pass --peer-python of a venv with litdata and megatron-core")
    print(f"\n{'reader':52} {'loader_tokens_per_s':>20}  payload per sequence")
    for name, rate in sorted(rows.items(), key=lambda kv: -kv[1] if kv[1] == kv[1] else 0.0):
        print(f"{name:52} {rate:20,.0f}  {payload[name]}")
    print("(best of --repeat samples of >= 0.5 s; weir's readers and the ceiling take turns, the peers run next;")
    print(f" weir's rows reuse their step plans except 'planning included': {m.global_batch} sequences per step;")
    print(f" weir's rows verify shard files (the default) unless marked verify=False; {load()})")
    for name in ("weir cp=1, full item", "weir cp=1, fields=input_ids+cu_seqlens"):
        ratio = rows[name] / rows[f"{name}, verify=False"]
        print(
            f"steady state, {name}: verified {rows[name]:,.0f} vs verify=False {rows[f'{name}, verify=False']:,.0f}"
            f" tokens/s = {ratio:.3f}x"
        )
    verdicts.cleanup()
    provenance(build, args.repeat)
    verification(build, args.repeat)
    t0 = time.perf_counter()
    ds = PackedDataset(build, world=World(0, 8 if len(shards) % 8 == 0 and (m.global_batch or 1) % 8 == 0 else 1))
    n_plan = sum(1 for _ in ds.assignments())
    print(f"\nopen + plan the whole build ({n_plan} items of rank 0): {time.perf_counter() - t0:.3f} s (once)")
    rate = args.mfu * args.peak_tflops * 1e12 / (6 * args.model_params)
    print(
        "\nsampler planning time per step (regroup + refinement + LPT/swaps, synthetic long-tailed costs), against a"
        " plausible"
        f"\nstep: a {args.model_params / 1e9:g}B-parameter model"
        f" (6·N = {6 * args.model_params / 1e9:g} GFLOP per token) at {args.mfu:.0%} MFU"
        f" of {args.peak_tflops:g} TFLOP/s = {rate:,.0f} tokens/s per GPU:"
    )
    for batch, dp, window, period, seq_len in (
        (64, 8, 1, 0, 8192),
        (1024, 128, 1, 0, 8192),
        (16, 16, 20, 10, 32768),
        (128, 128, 20, 10, 131072),
    ):
        sec = planning(batch, dp, window, period)
        tokens = batch // dp * seq_len
        step = step_seconds(tokens, args.model_params, args.mfu, args.peak_tflops)
        print(
            f"  global_batch={batch:5} dp={dp:4} window={window:3} period={period:2} S={seq_len:6}: "
            f"{sec * 1e3:7.3f} ms/step = "
            f"{sec / step:.3%} of a {step:.2f} s step ({tokens:,} tokens per rank);"
            f" < 1% of any step over {sec * 1e5:.0f} ms"
        )


if __name__ == "__main__":
    main()
