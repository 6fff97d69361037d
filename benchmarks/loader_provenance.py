"""``loader_tokens_per_s`` with provenance on against the loader as it was before provenance existed, side by
side: what turning provenance on costs a trainer measured against the loader it had.

The issue's goal reads "the loader's throughput within 1 % of today's with provenance on", *today* being the
loader of the commit the issue was measured on (``--before``, default ``0d4bc82``, before any provenance
field existed). ``benchmarks/loader.py --provenance-only`` compares this checkout's items with and without
provenance fields; this script adds that older loader beside them. Each reader (a tree and a payload) reads
in a process of its own (the older tree exported with ``git archive``, first on that process's ``sys.path``),
over the same build, kept for the whole run; the parent asks the readers in turn, round by round (the order
reversed every other round), each sample passes over the build for ≥ ``--min-s`` s after a warm-up pass, and
every round's ratios are kept. Printed per payload: the best tokens/s of the older loader (*before*, provenance
off: it has none), of this checkout with provenance off and on, and the medians over rounds of on ÷ before and
on ÷ off, by wall and by CPU time (``time.process_time`` of the reading process, which other jobs on a shared
machine disturb less). Single process (``num_workers=0``), cp 1, ``verify=False``, steps planned once (what is
timed is building items), files in page cache; the load average before and after.

    .venv/bin/weir build benchmarks/mixes/demo_8192.yaml --out build/bench/demo-8192   # once, after make demo
    .venv/bin/python benchmarks/loader_provenance.py [--build build/bench/demo-8192] [--before 0d4bc82] [--repeat 9]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from io import BytesIO
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parent.parent
FULL = ("input_ids", "labels", "position_ids", "indices", "cu_seqlens", "cu_seqlens_padded")
LEAN = ("input_ids", "cu_seqlens")
BOTH = ("source_ids", "segments")
# (payload, its fields without provenance, with): the per-segment provenance (source, document, offset: one
# tensor), the per-slot view of the sources, and both
PAIRS = (
    ("full item + segments", FULL, (*FULL, "segments")),
    ("full item + source_ids", FULL, (*FULL, "source_ids")),
    ("full item + both", FULL, (*FULL, *BOTH)),
    ("input_ids+cu_seqlens + segments", LEAN, (*LEAN, "segments")),
    ("input_ids+cu_seqlens + source_ids", LEAN, (*LEAN, "source_ids")),
)


def serve(tree: str, build: str, payloads: list[list[str]], min_s: float) -> None:
    """A child: readers of ``build`` with ``payloads`` from the packages under ``tree`` (this checkout where
    empty); answers each line ``k`` on stdin with one JSON line (tokens/s by wall and by CPU time) of reader
    ``k`` sampled for ≥ ``min_s`` s."""
    sys.path.insert(0, tree or str(ROOT))
    from loaders import PackedDataset, Payload, Reading, World

    readers = []
    for fields in payloads:
        ds = PackedDataset(
            build, world=World(0, 1, 0, 1), payload=Payload(fields=tuple(fields)), reading=Reading(verify=False)
        )
        plan = functools.partial(type(ds.planner).assignment.__wrapped__, ds.planner)  # type: ignore[attr-defined]
        ds.planner.assignment = functools.lru_cache(maxsize=None)(plan)  # type: ignore[method-assign]
        start = ds.state_dict()

        def read(ds: Any = ds, start: dict[str, Any] = start) -> int:
            ds.load_state_dict(start)
            return sum(int(item["input_ids"].numel()) for item in ds)

        read()  # warm-up: files in page cache, steps planned
        readers.append(read)
    print(json.dumps({"ready": len(readers)}), flush=True)
    for line in sys.stdin:
        fn = readers[int(line)]
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        while (elapsed := time.perf_counter() - t0) < min_s:
            n += fn()
        print(json.dumps([n / elapsed, n / (time.process_time() - c0)]), flush=True)


def export(rev: str, into: Path) -> Path:
    """The packages of ``rev`` (``git archive``) under ``into``; returns the folder to put on ``sys.path``."""
    names = subprocess.run(
        ["git", "ls-tree", "--name-only", rev], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    packages = [p for p in ("contract", "loaders", "mixing") if p in names]
    blob = subprocess.run(["git", "archive", rev, *packages], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(blob)) as tar:
        tar.extractall(into, filter="data")
    return into


class Child:
    """One reading process (see :func:`serve`)."""

    def __init__(self, tree: str, build: Path, payloads: Sequence[tuple[str, ...]], min_s: float) -> None:
        cmd = [sys.executable, __file__, "--serve", tree, "--build", str(build), "--min-s", str(min_s)]
        self.proc = subprocess.Popen(
            [*cmd, "--payloads", json.dumps(list(payloads))], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.stdin: IO[str] = self.proc.stdin  # type: ignore[assignment]
        self.stdout: IO[str] = self.proc.stdout  # type: ignore[assignment]
        json.loads(self.stdout.readline())  # ready: every reader warmed up

    def sample(self, k: int) -> tuple[float, float]:
        self.stdin.write(f"{k}\n")
        self.stdin.flush()
        wall, cpu = json.loads(self.stdout.readline())
        return float(wall), float(cpu)

    def close(self) -> None:
        self.stdin.close()
        self.proc.wait()


def med(xs: list[tuple[float, float]], ys: list[tuple[float, float]], i: int) -> float:
    """The median over rounds of ``ys[r][i] ÷ xs[r][i]`` (``i``: 0 wall, 1 CPU)."""
    return statistics.median(y[i] / x[i] for x, y in zip(xs, ys, strict=True))


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def compare(
    build: Path, before: str, repeat: int, min_s: float, before_tree: Path | None = None
) -> dict[str, dict[str, float]]:
    """Samples every payload's readers (before: off; this checkout: off and on) ``repeat`` rounds; prints and
    returns per payload the best tokens/s and the medians of the rounds' ratios. ``before_tree``: ``before``'s
    packages exported already (else exported here with ``git archive``)."""
    offs: list[tuple[str, ...]] = sorted({off for _, off, _ in PAIRS})
    mine = offs + [on for _, _, on in PAIRS]
    with tempfile.TemporaryDirectory() as tmp:
        tree = str(before_tree or export(before, Path(tmp)))
        # one process per reader: a process holding several readers' pooled arrays reads each more slowly
        children: dict[tuple[str, tuple[str, ...]], Child] = {
            ("before", f): Child(tree, build, [f], min_s) for f in offs
        }
        children.update({("now", f): Child("", build, [f], min_s) for f in mine})
        rates: dict[tuple[str, tuple[str, ...]], list[tuple[float, float]]] = {key: [] for key in children}
        head = load()
        for r in range(repeat):
            for key in list(children)[:: 1 if r % 2 == 0 else -1]:
                rates[key].append(children[key].sample(0))
        for child in children.values():
            child.close()
    print(
        f"\nprovenance on against the loader before it ({before}), build {build} (cp=1, verify=False, steps"
        f" planned once; {repeat} interleaved rounds of >= {min_s} s samples per reader;"
    )
    print(f" {head} before, {load()} after):")
    print(
        f"  {'payload':36} {'before tokens/s':>16} {'off tokens/s':>14} {'on tokens/s':>14} {'on/before':>10}"
        f" {'by CPU':>7} {'on/off':>7} {'by CPU':>7}"
    )
    out = {}
    for name, off, on in PAIRS:
        b, f, o = rates["before", off], rates["now", off], rates["now", on]

        row = {
            "before": max(x[0] for x in b),
            "off": max(x[0] for x in f),
            "on": max(x[0] for x in o),
            "on_before": med(b, o, 0),
            "on_before_cpu": med(b, o, 1),
            "on_off": med(f, o, 0),
            "on_off_cpu": med(f, o, 1),
        }
        out[name] = row
        print(
            f"  {name:36} {row['before']:16,.0f} {row['off']:14,.0f} {row['on']:14,.0f} {row['on_before']:10.3f}"
            f" {row['on_before_cpu']:7.3f} {row['on_off']:7.3f} {row['on_off_cpu']:7.3f}"
        )
    print("  (ratios: medians over rounds; goal: on within 1 % of the loader before provenance, on/before >= 0.99)")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--build", type=Path, default=ROOT / "build/bench/demo-8192")
    ap.add_argument("--before", default="0d4bc82", help="the commit whose loader is 'today's' (before provenance)")
    ap.add_argument(
        "--before-tree",
        type=Path,
        default=None,
        help="the --before commit's packages, exported already (git archive REV contract loaders mixing): for a"
        " machine without the repository's history",
    )
    ap.add_argument("--repeat", type=int, default=9, help="interleaved rounds")
    ap.add_argument("--min-s", type=float, default=0.5, help="seconds per sample")
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--payloads", default="[]", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve is not None:
        serve(args.serve, str(args.build), json.loads(args.payloads), args.min_s)
        return
    if not (args.build / "shards").is_dir() and not (args.build / "manifest.json").exists():
        sys.exit(
            f"no build at {args.build}: make one first, e.g. after make demo: .venv/bin/weir build"
            " benchmarks/mixes/demo_8192.yaml --out build/bench/demo-8192"
        )
    try:
        git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        commit = git.stdout.strip() or "(not a git checkout)"
    except OSError:  # no git on this machine
        commit = "(no git here)"
    print(f"commit {commit}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    compare(args.build, args.before, args.repeat, args.min_s, args.before_tree)


if __name__ == "__main__":
    main()
