"""``loader_tokens_per_s`` per rank from page cache: weir's PackedDataset beside a raw ``np.memmap`` copy
(the ceiling) and peers reading the same packed tokens (LitData ``StreamingDataset`` + ``TokensLoader``,
megatron-core's ``IndexedDataset``), plus the sampler's planning time per step.

Peers run in a separate venv (``--peer-python``; their pins need not match ours) through
``benchmarks/loader_peers.py``; without one they are reported as not measured. Every reader delivers
int64 torch tensors of S tokens, single process (``num_workers=0``), after one warm-up pass so the
files are in page cache.

    .venv/bin/python benchmarks/loader.py [--build build/demo] [--peer-python /tmp/peer/bin/python]

The peer venv (it borrows this venv's torch and numpy through a .pth file, so no other torch is pulled)::

    python3 -m venv /tmp/peer
    /tmp/peer/bin/pip install --no-deps litdata==0.2.76 megatron-core==0.16.1 lightning-utilities
    echo "$PWD/.venv/lib/python3.11/site-packages" > /tmp/peer/lib/python3.11/site-packages/weir-venv.pth
"""

from __future__ import annotations

import sys
from pathlib import Path

# This folder holds tokenize.py (the tokenizer benchmark): run as a script, it would shadow the standard
# library's tokenize for every module imported below, so take this folder off the import path first.
if Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path.pop(0)

import argparse
import subprocess
import tempfile
import time

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loaders import PackedDataset
from loaders.balance import assign_ranks, regroup_window
from mixing.shards import ShardSet


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
    for shard in shards.manifest["shards"]:
        arr = np.load(shards.dir / shard["files"]["tokens"]["name"], mmap_mode="r")
        for row in arr:
            n += torch.from_numpy(row.astype(np.int64)).numel()
    return n


def weir(build: Path, cp_size: int, cp_rank: int):
    """A reader over one PackedDataset built once (opening and planning are timed apart, in main)."""
    ds = PackedDataset(build, 0, 1, cp_rank, cp_size)
    start = ds.state_dict()

    def read() -> int:
        ds.load_state_dict(start)
        return sum(int(item["input_ids"].numel()) for item in ds)

    return read


def weir_per_item(build: Path):
    """The per-sequence path (``PackedDataset.item``, what iteration did before chunks; still the cp>1 path)."""
    ds = PackedDataset(build, 0, 1)
    seqs = ds.rank_sequences().tolist()

    def read() -> int:
        return sum(int(ds.item(i)["input_ids"].numel()) for i in seqs)

    return read


def planning(batch: int, dp: int, window: int, steps: int = 64) -> float:
    """Seconds per step to regroup and assign synthetic long-tailed costs (no I/O)."""
    rng = np.random.default_rng(0)
    costs = rng.pareto(1.0, batch * steps) + 1
    src = rng.integers(0, 1000, (batch * steps, 5))
    t0 = time.perf_counter()
    for a in range(0, steps, window):
        sl = slice(a * batch, (a + window) * batch)
        new = regroup_window(costs[sl], src[sl], window)
        for g in range(window):
            assign_ranks(costs[sl][new == g], dp)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", type=Path, help="a weir build (default: build the embedded demo into build/bench)")
    ap.add_argument("--peer-python", help="python of a venv with litdata and megatron-core")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=8192, help="S of the demo build made when --build is absent")
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
    print(f"build {build}: {len(shards)} sequences of {m['seq_len']} tokens ({m['dtype']}), single process")
    rows = interleaved(
        {
            "raw np.memmap copy (ceiling)": lambda: raw_memmap(shards),
            "weir PackedDataset cp=1": weir(build, 1, 0),
            "weir PackedDataset.item() per sequence, cp=1": weir_per_item(build),
            "weir PackedDataset cp=2 (per rank)": weir(build, 2, 0),
        },
        args.repeat,
    )
    if args.peer_python:
        with tempfile.TemporaryDirectory() as tmp:
            proc = subprocess.run(
                [
                    args.peer_python,
                    str(ROOT / "benchmarks" / "loader_peers.py"),
                    str(shards.dir),
                    tmp,
                    str(args.repeat),
                ],
                capture_output=True,
                text=True,
            )
            for line in proc.stdout.splitlines():
                if line.startswith("PEER\t"):
                    _, name, value = line.split("\t")
                    rows[name] = float(value)
            errors = [ln for ln in proc.stderr.splitlines() if " failed: " in ln]
            if proc.returncode or errors:
                print(f"peer run (exit {proc.returncode}): {errors or proc.stderr[-800:]}")
    else:
        rows["peers (LitData, megatron-core)"] = float("nan")
        print("peers not measured: pass --peer-python of a venv with litdata and megatron-core")
    print(f"\n{'reader':46} {'loader_tokens_per_s':>20}")
    for name, value in rows.items():
        print(f"{name:46} {value:20,.0f}")
    print("(weir delivers input_ids, labels, position_ids (int64 [S] each), indices and cu_seqlens per item;")
    print(" the peers and the ceiling deliver input_ids only)")
    t0 = time.perf_counter()
    ds = PackedDataset(build, 0, 8 if len(shards) % 8 == 0 and m["global_batch"] % 8 == 0 else 1)
    n_plan = sum(1 for _ in ds.plan())
    print(f"\nopen + plan the whole build ({n_plan} items of rank 0): {time.perf_counter() - t0:.3f} s (once)")
    print("\nsampler planning time per step (regroup + LPT/swaps, synthetic long-tailed costs):")
    for batch, dp, window in ((64, 8, 1), (16, 16, 16), (1024, 128, 16)):
        sec = planning(batch, dp, window)
        print(
            f"  global_batch={batch:5} dp={dp:4} window={window:3}: {sec * 1e3:7.3f} ms/step = {sec:.2%} of a 1 s step"
        )


if __name__ == "__main__":
    main()
