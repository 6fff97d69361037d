"""How long ``weir lookup`` takes for one step of a build whose sources hold 10 M small documents each.

    .venv/bin/python benchmarks/lookup.py --before 3c8d4c3       # 3 sources × 10 M documents (made once, ~30 s)
    .venv/bin/python benchmarks/lookup.py --docs 1000000         # a quick run (sources of 1 M documents)
    .venv/bin/python benchmarks/lookup.py --layout defaults      # docs.parquet with pyarrow's defaults (LAYOUTS)
    .venv/bin/python benchmarks/lookup.py --seq-len 8192 --steps 5000 --samples 3   # steps of ~570 segments

The build (made once, kept under ``--dir``: ``build/bench/lookup-<docs>-<S>-<batch>-<steps>-<rows>-<layout>/``,
reused when its manifest is there) is ``benchmarks/lookup_build.py``'s (its docstring says what it holds):
three sources of ``--docs`` documents each (``sources/<name>/docs.parquet``) and ``--steps`` steps of
``--global-batch`` sequences of ``--seq-len`` tokens (``shards/``), written straight into the build's files.

**The figures**, per code tree (``--before REV``: a git revision exported to a temporary folder; then this
checkout), in a fresh Python process pinned to one core (``taskset``; pyarrow's pools and the tokenizer at one
thread), files in the page cache (every file but the token files read once before timing):

- import: ``import mixing.provenance``;
- per sampled step (``--samples``, spread over the build): ``Provenance(build).lookup(step_sequences(step))`` on a
  fresh object, the first in the process (*first*: what ``weir lookup`` pays after its imports) and later ones
  (*cold*: a fresh object, the process warm), then the same object again (*warm*), with and without ``--text``,
  each split into stages: ``open`` (``Provenance(build)``: the manifest), ``sequences`` (the step's sequences
  from their shards), ``index`` (each document's file and record from its source's ``docs.parquet``: footer,
  row groups, rows), ``decode`` (``--text``: the tokenizer loaded, the pieces decoded) and ``rest`` (pieces made);
  wall and CPU time (``time.process_time``: what other jobs on a shared core disturb least);
- ``weir lookup BUILD --step S --json`` end to end (a subprocess, imports included; ``--text`` too), the best
  of ``--repeat`` per step; for this checkout through ``.venv/bin/weir`` as well; with ``--before``, whether
  both trees print the same ``--json --text`` for every step timed.

Each row is the step with the median total over the sampled steps (cold, warm: each the best of ``--repeat``),
so its stages add up; the CLI rows are medians; the 1-minute load average before and after each tree.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.lookup_build import LAYOUTS, make_build

ROOT = Path(__file__).resolve().parent.parent
CLI = "import sys; from pipelines.cli import app; sys.argv[0] = 'weir'; app()"


class Stages:
    """Wall and CPU seconds per stage of one lookup, accumulated by wrapping the methods that do them."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    def wrap(self, stage: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall[stage] = self.wall.get(stage, 0.0) + time.perf_counter() - w
                self.cpu[stage] = self.cpu.get(stage, 0.0) + time.process_time() - c

        return timed


def one_lookup(build: Path, step: int, text: bool, prov: Any = None) -> tuple[Any, dict[str, dict[str, float]], int]:
    """``Provenance(build).lookup(step_sequences(step), text=text)`` (on ``prov`` when given: warm), timed by
    stage; returns the object, {"wall"|"cpu": {stage: s}} and the pieces."""
    from mixing.provenance import Provenance

    st = Stages()
    w0, c0 = time.perf_counter(), time.process_time()
    if prov is None:
        prov = st.wrap("open", Provenance)(build)
    prov.shards.sequence = st.wrap("sequences", type(prov.shards).sequence.__get__(prov.shards))
    prov._documents = st.wrap("index", type(prov)._documents.__get__(prov))
    load = type(prov)._tokenizer.__get__(prov)

    def tokenizer() -> None:  # the tokenizer loaded (once per object), then its decoder timed too
        st.wrap("decode", load)()
        raw = prov.__dict__.setdefault("_bench_decode", prov._decode)
        prov._decode = st.wrap("decode", raw)

    prov._tokenizer = tokenizer
    pieces = prov.lookup(prov.step_sequences(step), text=text)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    for d, total in ((st.wall, wall), (st.cpu, cpu)):
        d["rest"] = total - sum(d.values())
        d["total"] = total
    return prov, {"wall": st.wall, "cpu": st.cpu}, len(pieces)


def use_tree(tree: Path) -> None:
    """Import the project's packages from ``tree`` from now on: this script imported the checkout's (its build's
    index layout) before it knew which tree it times, and a package already imported would be used again."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("contract", "mixing", "loaders")]:
        del sys.modules[name]
    sys.path.insert(0, str(tree))


def child(build: Path, steps: list[int], repeat: int) -> None:
    """Runs in the tree under test (``PYTHONPATH``), pinned to one core: prints one JSON line of figures."""
    w0, c0 = time.perf_counter(), time.process_time()
    import mixing.provenance

    out: dict[str, Any] = {"import": {"wall": time.perf_counter() - w0, "cpu": time.process_time() - c0}}
    out["module"] = mixing.provenance.__file__
    import pyarrow as pa

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    runs: dict[str, list[dict[str, Any]]] = {"first": [], "cold": [], "warm": [], "cold --text": [], "warm --text": []}
    _, first, n = one_lookup(build, steps[0], False)
    runs["first"].append({**first, "step": steps[0], "pieces": n})
    for step in steps:
        for text in (False, True):
            suffix = " --text" if text else ""
            best: dict[str, Any] = {}
            warm: dict[str, Any] = {}
            for _ in range(repeat):
                prov, cold, n = one_lookup(build, step, text)
                if not best or cold["wall"]["total"] < best["wall"]["total"]:
                    best = {**cold, "step": step, "pieces": n}
                for _ in range(2):
                    _, again, n = one_lookup(build, step, text, prov)
                    if not warm or again["wall"]["total"] < warm["wall"]["total"]:
                        warm = {**again, "step": step, "pieces": n}
            runs["cold" + suffix].append(best)
            runs["warm" + suffix].append(warm)
    out["runs"] = runs
    print("RESULT " + json.dumps(out))


def sampled_steps(steps: int, samples: int) -> list[int]:
    """``samples`` steps spread evenly over a build of ``steps``, the first and the last among them."""
    return sorted({round(i * (steps - 1) / max(1, samples - 1)) for i in range(samples)})


def describe(build: Path, steps: list[int]) -> str:
    """What the sampled steps ask of the sources' indexes: segments, distinct documents and row groups."""
    from contract.shards import ShardSet
    from mixing.doc_lookup import DocLookup

    shards = ShardSet(build / "shards")
    names = shards.manifest.sources or ()
    starts = [DocLookup(build / "sources" / n / "docs.parquet", None).starts for n in names]
    per = shards.manifest.sequences_per_step or 1
    segs, docs, groups = [], [], []
    for t in steps:
        s = np.concatenate([shards.sequence(i).segments for i in range(t * per, (t + 1) * per)])
        segs.append(len(s))
        for k in range(len(names)):
            d = np.unique(s[s[:, 0] == k, 1])
            docs.append(len(d))
            groups.append(len(np.unique(np.searchsorted(starts[k], d, side="right"))))
    rows = int(np.median(np.diff(starts[0])))
    return (
        f"{len(names)} sources ({', '.join(names)}) of {int(starts[0][-1]):,} documents, {len(starts[0]) - 1} row "
        f"groups of ~{rows:,} rows each; a step: {int(np.median(segs))} segments (median of {len(steps)} steps), "
        f"per source {int(np.median(docs))} documents in {int(np.median(groups))} row groups (medians)"
    )


def run_child(tree: Path, build: Path, steps: list[int], repeat: int, core: int) -> dict[str, Any]:
    cmd = ["taskset", "-c", str(core), sys.executable, str(Path(__file__).resolve()), "--child", str(tree)]
    cmd += ["--build", str(build), "--sampled", ",".join(map(str, steps)), "--repeat", str(repeat)]
    proc = subprocess.run(cmd, env=one_thread(tree), capture_output=True, text=True, cwd=tree)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise SystemExit(f"{tree}: exit {proc.returncode}\n{proc.stderr[-3000:]}")


def one_thread(tree: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(tree),
        "RAYON_NUM_THREADS": "1",
        "OMP_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }


def run_cli(tree: Path, argv: list[str], core: int, repeat: int) -> tuple[float, float, str]:
    """``argv`` (a weir command line) run ``repeat`` times pinned to ``core``: the best wall and CPU seconds
    (user + system, the process and its children) and its output."""
    best_w = best_c = float("inf")
    out = ""
    for _ in range(repeat):
        r0 = os.times()
        w0 = time.perf_counter()
        proc = subprocess.run(["taskset", "-c", str(core), *argv], env=one_thread(tree), capture_output=True, cwd=tree)
        wall = time.perf_counter() - w0
        r1 = os.times()
        if proc.returncode:
            raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}\n{proc.stderr.decode()[-3000:]}")
        best_w = min(best_w, wall)
        best_c = min(best_c, (r1.children_user - r0.children_user) + (r1.children_system - r0.children_system))
        out = proc.stdout.decode()
    return best_w, best_c, out


def cli_figures(
    tree: Path, build: Path, steps: list[int], core: int, repeat: int, entry: list[str]
) -> tuple[dict[str, tuple[float, float]], dict[int, str]]:
    """Median over ``steps`` of the best end-to-end wall and CPU seconds of ``weir lookup --json`` and with
    ``--text``; and each step's ``--json --text`` output."""
    out: dict[str, tuple[float, float]] = {}
    texts: dict[int, str] = {}
    for flags in (["--json"], ["--json", "--text"]):
        wall, cpu = [], []
        for t in steps:
            w, c, text = run_cli(tree, [*entry, "lookup", str(build), "--step", str(t), *flags], core, repeat)
            wall.append(w)
            cpu.append(c)
            if "--text" in flags:
                texts[t] = text
        out[" ".join(flags)] = (statistics.median(wall), statistics.median(cpu))
    return out, texts


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median total wall time (its stages add up to it)."""
    ordered = sorted(runs, key=lambda r: r["wall"]["total"])
    return ordered[(len(ordered) - 1) // 2]


def report(name: str, r: dict[str, Any], cli: dict[str, dict[str, tuple[float, float]]]) -> None:
    imp = r["import"]
    print(f"\n{name}: {r['module']}")
    print(f"  import mixing.provenance: {imp['wall'] * 1e3:.0f} ms wall, {imp['cpu'] * 1e3:.0f} ms CPU")
    stages = ("open", "sequences", "index", "decode", "rest", "total")
    print("  Provenance(build).lookup(step), ms wall (CPU) by stage; the step with the median total:")
    print(f"  {'':12}" + "".join(f"{s:>16}" for s in stages))
    for mode, runs in r["runs"].items():
        m = median_run(runs)
        cells = [
            f"{m['wall'][s] * 1e3:7.1f} ({m['cpu'][s] * 1e3:5.1f})" if s in m["wall"] else f"{'-':>15}" for s in stages
        ]
        print(f"  {mode:12}" + "".join(f"{c:>16}" for c in cells))
    for entry, figures in cli.items():
        for flags, (w, c) in figures.items():
            print(f"  {entry} lookup BUILD --step S {flags}: {w * 1e3:.0f} ms wall, {c * 1e3:.0f} ms CPU (median step)")


def load() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=10_000_000, help="documents per source")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--global-batch", type=int, default=16, help="sequences per step")
    ap.add_argument("--steps", type=int, default=20_000, help="steps of the build")
    ap.add_argument("--group-rows", type=int, default=16_384, help="rows per row group of docs.parquet")
    ap.add_argument("--layout", choices=sorted(LAYOUTS), default="weir", help="how docs.parquet is encoded")
    ap.add_argument("--samples", type=int, default=5, help="steps timed, spread over the build")
    ap.add_argument("--repeat", type=int, default=3, help="runs per step and way (the best is kept)")
    ap.add_argument("--before", help="git revision of the code to compare with (exported to a temporary folder)")
    ap.add_argument("--core", type=int, default=max(os.sched_getaffinity(0)), help="the core every run is pinned to")
    ap.add_argument("--dir", type=Path, default=ROOT / "build" / "bench", help="where the synthetic build is kept")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--build", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--sampled", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        use_tree(args.child)
        child(args.build, [int(s) for s in args.sampled.split(",")], args.repeat)
        return
    sys.path.insert(0, str(ROOT))
    steps = sampled_steps(args.steps, args.samples)
    name = f"lookup-{args.docs}-{args.seq_len}-{args.global_batch}-{args.steps}-{args.group_rows}-{args.layout}"
    t0 = time.perf_counter()
    build = make_build(
        args.dir / name, args.docs, args.seq_len, args.global_batch, args.steps, args.group_rows, args.layout, steps
    )
    made = time.perf_counter() - t0
    for f in build.rglob("*"):  # into the page cache, but the (sparse) token files: a lookup reads a few rows
        if f.is_file() and not f.name.endswith(".tokens.npy"):
            f.read_bytes()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout
    print(f"build {build} ({made:.0f} s to make or find): {describe(build, steps)}")
    print(
        f"S={args.seq_len}, {args.global_batch} sequences a step, {args.steps:,} steps; docs.parquet layout "
        f"{args.layout!r}; steps timed {steps}; every run pinned to core {args.core}, best of {args.repeat}; "
        f"commit {commit.strip()}, {time.strftime('%Y-%m-%d %H:%M %Z')}"
    )
    trees: dict[str, Path] = {}
    texts: dict[str, dict[int, str]] = {}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        if args.before:
            tree = Path(tmp) / "before"
            tree.mkdir()
            archive = subprocess.run(["git", "archive", args.before], capture_output=True, check=True, cwd=ROOT).stdout
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
            trees[f"before ({args.before})"] = tree
        trees["this checkout"] = ROOT
        for label, tree in trees.items():
            before = load()
            r = run_child(tree, build, steps, args.repeat, args.core)
            python = [sys.executable, "-c", CLI]
            cli = {}
            cli["python -c 'pipelines.cli.app()'"], texts[label] = cli_figures(
                tree, build, steps, args.core, args.repeat, python
            )
            if tree == ROOT:
                cli[".venv/bin/weir"], _ = cli_figures(
                    tree, build, steps, args.core, args.repeat, [str(Path(sys.executable).parent / "weir")]
                )
            report(label, r, cli)
            print(f"  load average {before} before, {load()} after")
    if len(texts) == 2:
        a, b = texts.values()
        print(f"\nweir lookup --json --text prints the same as before for every step timed: {a == b}")


if __name__ == "__main__":
    main()
