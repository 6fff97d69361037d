"""What a rank's loader costs to open a large build, before and after the memory-mapped index (loaders.index).

Writes (once, kept under --dir) a synthetic build of ``--sequences`` sequences: real ``meta.npz`` files (the
metadata every loader reads: steps, ~``--segments`` segments per sequence, costs) and *sparse* token files
(``truncate``: nothing reads tokens beyond the first items, and those are zeros), with a valid manifest
(``contract.manifest.write_manifest``). The token files' sha256 are placeholders, so every reader here runs
with ``verify=False`` (the figures leave out hashing, which happens once per node).

Then, for each code tree (``--before``: a git revision exported to a temporary folder, e.g. the commit
this work started from; and this checkout), one fresh Python process (``PYTHONPATH`` = that tree) does:

- open ``PackedDataset(fields=("input_ids", "cu_seqlens"), verify=False)`` (for this checkout twice: the
  first open on the node makes the index, the second maps it);
- iterate a ``PackedLoader(num_workers=--workers)`` until every worker has built items, then read
  ``/proc/PID/smaps`` of the main process and each worker: PSS (what the process costs the node, shared
  pages divided among their sharers), and the part of it that maps the index files;
- a restart at the first, the middle and the last step: a fresh dataset opened, ``load_state_dict``, time
  to its first item, in-process and through a fresh ``PackedLoader`` (its workers' fork included); the best of
  ``--repeat``.

    .venv/bin/python benchmarks/loader_index.py --sequences 10000000 --before d5e26eb
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
LEAN = ("input_ids", "cu_seqlens")


def write_sparse_shard(
    shards_dir: Path, k: int, meta: dict[str, np.ndarray], shape: tuple[int, int], dtype: np.dtype[Any]
) -> tuple[Path, dict[str, Any]]:
    """Shard ``k`` of a synthetic build: ``meta`` as ``shard-<k>.meta.npz`` and a sparse ``shard-<k>.tokens.npy``
    of ``shape`` (sequences, S) in ``dtype`` (its header written, no block of its data). (The token file, the
    shard's ``files`` entry for the manifest: the tokens' sha256 a placeholder, so readers open it with
    ``verify=False``; the metadata's real.)"""
    buf = io.BytesIO()
    np.savez(buf, allow_pickle=True, **meta)  # its default, named: else mypy reads **meta as filling it
    data = buf.getvalue()
    meta_name, tok_name = f"shard-{k:05d}.meta.npz", f"shard-{k:05d}.tokens.npy"
    (shards_dir / meta_name).write_bytes(data)
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": dtype.str, "fortran_order": False, "shape": shape})
    tok = shards_dir / tok_name
    tok.write_bytes(header.getvalue())
    size = len(header.getvalue()) + shape[0] * shape[1] * dtype.itemsize
    os.truncate(tok, size)  # sparse: no block written
    return tok, {
        "tokens": {"name": tok_name, "bytes": size, "sha256": "0" * 64},
        "meta": {"name": meta_name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()},
    }


def make_build(out: Path, n: int, seq_len: int, segments: int, per_shard: int, batch: int) -> Path:
    """A synthetic build of ``n`` sequences (``batch`` per step), about ``segments`` segments each, in shards
    of ``per_shard`` sequences: real metadata, sparse token files, placeholder token sha256."""
    sys.path.insert(0, str(ROOT))
    from contract.cost import CostModel
    from contract.manifest import write_manifest

    cost_model = CostModel()  # attention only
    shards_dir = out / "shards"
    if (shards_dir / "manifest.json").exists():
        return out
    shards_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    shards, doc = [], 0
    for k, lo in enumerate(range(0, n, per_shard)):
        hi = min(n, lo + per_shard)
        m = hi - lo
        count = rng.integers(1, 2 * segments, m)  # mean ≈ segments
        used = seq_len - rng.integers(0, 64, m)
        count = np.minimum(count, used)
        offs = np.concatenate([[0], np.cumsum(count)]).astype(np.int64)
        owner = np.repeat(np.arange(m), count)
        length = used[owner] // count[owner]
        first = offs[:-1]
        length[first] += used - (used // count) * count  # the remainder goes to each sequence's first segment
        segs = np.stack(
            [rng.integers(0, 4, len(owner)), doc + np.arange(len(owner)), np.zeros(len(owner), np.int64), length], 1
        ).astype(np.int64)
        doc += len(owner)
        meta = {
            "step": (np.arange(lo, hi) // batch).astype(np.int64),
            "seg_offsets": offs,
            "segments": segs,
            "seg_cost": cost_model.of(length),
            "seq_tokens": used.astype(np.int64),
            "seq_cost": cost_model.sequences(offs, length),
        }
        files = write_sparse_shard(shards_dir, k, meta, (m, seq_len), np.dtype(np.uint16))[1]
        shards.append({"first_sequence": lo, "sequences": m, "files": files})
    manifest = {
        "format_version": 3,
        "seq_len": seq_len,
        "sequences": n,
        "sequences_per_step": batch,
        "dtype": "uint16",
        "global_batch": batch,
        "steps": n // batch,
        "pad_id": 0,
        "vocab_size": 65536,
        "sources": ["a", "b", "c", "d"],
        "cost": {"attention": cost_model.attention, "linear": cost_model.linear},
        "shards": shards,
    }
    write_manifest(shards_dir, manifest)
    return out


def smaps(pid: int, index_dir: str) -> dict[str, float]:
    """MiB of ``pid``: RSS, PSS, and the PSS of its mappings of files under ``index_dir``."""
    rss = pss = pss_index = 0
    in_index = False
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            head = line.split(maxsplit=1)[0]
            if not head.endswith(":"):  # a mapping's first line: address range … [path]
                parts = line.split()
                in_index = len(parts) >= 6 and bool(index_dir) and parts[5].startswith(index_dir)
            elif head == "Rss:":
                rss += int(line.split()[1])
            elif head == "Pss:":
                kb = int(line.split()[1])
                pss += kb
                pss_index += kb if in_index else 0
    return {"rss": rss / 1024, "pss": pss / 1024, "pss_index": pss_index / 1024}


def children() -> list[int]:
    """Process ids of this process's children (the DataLoader's workers)."""
    pids: list[int] = []
    for task in Path("/proc/self/task").iterdir():
        pids += [int(p) for p in (task / "children").read_text().split()]
    return sorted(pids)


def child(build: Path, cache: Path, workers: int, steps_at: str, repeat: int) -> None:
    """Runs in the tree under test (PYTHONPATH): prints one JSON line of figures."""
    import torch  # noqa: F401  (imported before timing: its import is not the loader's)

    from loaders import PackedDataset, PackedLoader, Payload, Reading, World

    out: dict[str, object] = {}
    t0 = time.perf_counter()
    ds = PackedDataset(
        build, world=World(0, 1), payload=Payload(fields=LEAN), reading=Reading(verify=False, cache_dir=cache)
    )
    out["open_s"] = time.perf_counter() - t0
    start = ds.state_dict()
    index = getattr(ds.shards, "_index_dir", None)
    out["indexed"] = index is not None
    loader = PackedLoader(ds, num_workers=workers)
    it = iter(loader)
    t0 = time.perf_counter()
    next(it)
    out["first_item_s"] = time.perf_counter() - t0
    for _ in range(workers * ds.settings.chunk + 1):  # every worker has built a chunk of items
        next(it)
    procs = {"main": os.getpid(), **{f"worker{w}": pid for w, pid in enumerate(children())}}
    out["memory_mib"] = {name: smaps(pid, str(index) if index else "") for name, pid in procs.items()}
    del it, loader
    steps = ds.planner.steps
    per_rank = ds.per_rank
    resume = {}
    for t in [int(s) for s in steps_at.split(",")] if steps_at else [0, steps // 2, steps - 1]:
        state = ds.state_at(t - 1, per_rank - 1) if t else start
        times: dict[str, float] = {}
        for how in ("in_process_s", "workers_s") * repeat:  # a restart: a fresh dataset, the state, its first item
            t0 = time.perf_counter()
            fresh = PackedDataset(
                build, world=World(0, 1), payload=Payload(fields=LEAN), reading=Reading(verify=False, cache_dir=cache)
            )
            reader: Any = fresh if how == "in_process_s" else PackedLoader(fresh, num_workers=workers)
            reader.load_state_dict(state)
            item = next(iter(reader))
            times[how] = min(times.get(how, float("inf")), time.perf_counter() - t0)
            assert item["step"] == t, (item["step"], t)
            del fresh, reader
        resume[t] = times
    out["resume"] = resume
    print("RESULT " + json.dumps(out))


def run_tree(tree: Path, build: Path, cache: Path, workers: int, steps_at: str, repeat: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(tree), "--build", str(build)]
    cmd += ["--cache", str(cache), "--workers", str(workers), "--steps-at", steps_at, "--repeat", str(repeat)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tree)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{tree}: exit {proc.returncode}\n{proc.stderr[-3000:]}")


def report(name: str, r: dict) -> None:
    print(f"\n{name}: open {r['open_s']:.2f} s (index {'mapped' if r['indexed'] else 'not used'}),")
    print(f"  first item through the loader's workers {r['first_item_s']:.2f} s")
    print(f"  {'process':8} {'RSS MiB':>9} {'PSS MiB':>9} {'of it the index':>16} {'PSS beyond the index':>21}")
    for proc, m in r["memory_mib"].items():
        print(f"  {proc:8} {m['rss']:9.1f} {m['pss']:9.1f} {m['pss_index']:16.1f} {m['pss'] - m['pss_index']:21.1f}")
    for t, v in r["resume"].items():
        print(
            f"  restart at step {int(t):>7} (open, load_state_dict, first item): {v['workers_s']:.3f} s through"
            f" the workers (fork included), {v['in_process_s']:.3f} s in-process"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sequences", type=int, default=1_000_000)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--segments", type=int, default=3, help="mean segments per sequence")
    ap.add_argument("--global-batch", type=int, default=512)
    ap.add_argument("--per-shard", type=int, default=2048, help="sequences per shard (weir's 16 Mi tokens at S=8192)")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--dir", type=Path, default=ROOT / "build" / "bench", help="where the synthetic build is kept")
    ap.add_argument("--before", help="git revision of the code to compare with (exported to a temporary folder)")
    ap.add_argument("--repeat", type=int, default=1, help="restarts timed per step and way (the best is shown)")
    ap.add_argument("--steps-at", default="", help="comma-separated steps to resume at (default: first, middle, last)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(args.child))
        child(args.build, args.cache, args.workers, args.steps_at, args.repeat)
        return
    args.sequences -= args.sequences % args.global_batch  # whole steps
    name = f"index-{args.sequences}-{args.seq_len}-{args.segments}"
    t0 = time.perf_counter()
    build = make_build(args.dir / name, args.sequences, args.seq_len, args.segments, args.per_shard, args.global_batch)
    from contract.shards import ShardSet

    m = ShardSet(build / "shards").manifest
    meta_bytes = sum(s.files.meta.bytes for s in m.shards)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    print(
        f"build {build}: {m.sequences:,} sequences of {m.seq_len} tokens in {len(m.shards)} shards,"
        f" {meta_bytes / 2**20:,.0f} MiB of meta.npz, sparse token files ({time.perf_counter() - t0:.0f} s);"
        f" verify=False; {args.workers} workers; commit {commit.strip()}"
    )
    print("load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = {}
        if args.before:
            tree = Path(tmp) / "before"
            tree.mkdir()
            archive = subprocess.run(["git", "archive", args.before], capture_output=True, check=True, cwd=ROOT).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            rows[f"before ({args.before})"] = run_tree(
                tree, build, Path(tmp) / "cache-before", args.workers, args.steps_at, args.repeat
            )
        cache = Path(tmp) / "cache"
        rows["after, first open on the node (makes the index)"] = run_tree(
            ROOT, build, cache, args.workers, args.steps_at, args.repeat
        )
        rows["after, the node's index"] = run_tree(ROOT, build, cache, args.workers, args.steps_at, args.repeat)
        index_bytes = sum(p.stat().st_size for p in (cache / "index").rglob("*.npy"))
        for name, r in rows.items():
            report(name, r)
    print(f"\nindex files: {index_bytes / 2**20:,.0f} MiB per node")
    print("load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
