"""What a ``weir`` command costs its user beyond its work: the wall and CPU time of ``weir build`` of a small mix
(whose work is a fraction of a second), ``weir inspect``, ``weir validate`` and loading the Dagster definitions
(what every process of ``weir ui`` does first), for this checkout and another commit side by side.

Each tree (``--before``, exported with ``git archive``, and this checkout) runs the real command in a process of
its own, as ``python -m pipelines.cli`` from the tree's root (so that its packages are the ones imported), with a
Dagster home of its own; rounds alternate the trees (the order reversed every other round) and every round's ratio
is kept. Printed per command: the median wall seconds of each tree, the CPU seconds (user + system of the
command's process and its children), and the median over rounds of this checkout's ÷ the other's; the load
average before and after. The small mix is written into a temporary folder: 400 text documents and 200 jsonl
records, the bytes tokenizer, 16 steps of 8 sequences of 256 tokens.

    .venv/bin/python benchmarks/cli.py [--before 0f6c6e0] [--repeat 7]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MIX = """\
name: small
seed: 1
tokenizer: {{kind: bytes}}
sequence: {{length: 256, global_batch: 8}}
sources:
  notes: {{uri: "{data}/notes/*.txt", format: text}}
  qa: {{uri: "{data}/qa.jsonl", format: jsonl, template: "Q: {{q}} A: {{a}}"}}
curriculum:
  - {{phase: main, steps: 16, mixture: {{notes: 0.6, qa: 0.4}}}}
"""


def write_mix(folder: Path) -> Path:
    """The small mix and its data under ``folder``; returns the mix file."""
    (folder / "notes").mkdir(parents=True)
    for i in range(400):
        words = " ".join(f"w{(i * 31 + k) % 97}" for k in range(20 + (i * 37) % 180))
        (folder / "notes" / f"n{i:03d}.txt").write_text(f"Note {i}. {words}.\n")
    qa = [json.dumps({"q": f"what is {i} times {i}?", "a": str(i * i)}) for i in range(200)]
    (folder / "qa.jsonl").write_text("\n".join(qa) + "\n")
    mix = folder / "small.yaml"
    mix.write_text(MIX.format(data=folder))
    return mix


def export(rev: str, into: Path) -> Path:
    """The whole tree of ``rev`` (``git archive``) under ``into``."""
    into.mkdir(parents=True)
    blob = subprocess.run(["git", "archive", rev], cwd=ROOT, check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=blob, check=True)
    return into


# what every process of `weir ui` does first (its code server, each step's process): load the definitions
DEFINITIONS = "import pipelines.definitions as d, os; d.defs.get_repository_def().get_all_jobs(); os._exit(0)"


def timed(tree: Path, home: Path, *args: str) -> tuple[float, float]:
    """Wall and CPU seconds of ``weir ARGS`` run from ``tree`` (``definitions``: :data:`DEFINITIONS`); a command
    that fails stops the benchmark."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    argv = ["-c", DEFINITIONS] if args == ("definitions",) else ["-m", "pipelines.cli", *args]
    r = subprocess.run(
        [sys.executable, *argv],
        cwd=tree,
        env={**os.environ, "DAGSTER_HOME": str(home)},
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode:
        said = " ".join((r.stderr.strip() or r.stdout.strip()).splitlines()[-1:])
        sys.exit(f"{' '.join(args)} in {tree} exited {r.returncode}: {said}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def load() -> str:
    return "load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default="0f6c6e0", help="the commit to compare with (default %(default)s)")
    parser.add_argument("--repeat", type=int, default=7, help="rounds (default %(default)s)")
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], cwd=ROOT).returncode != 0
    changes = " with uncommitted changes" if dirty else ""
    print(f"this checkout ({commit.stdout.strip()}{changes}) against {args.before}; {load()}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        mix = write_mix(tmp / "data")
        trees = {"before": export(args.before, tmp / "before"), "this": ROOT}
        for name in trees:
            (tmp / f"home-{name}").mkdir()
        commands = ("build", "inspect", "validate", "definitions")
        times: dict[tuple[str, str], list[tuple[float, float]]] = {(c, t): [] for c in commands for t in trees}
        for r in range(args.repeat):
            for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                tree, home, out = trees[name], tmp / f"home-{name}", tmp / f"out-{name}-{r}"
                times[("build", name)].append(timed(tree, home, "build", str(mix), "--out", str(out)))
                times[("inspect", name)].append(timed(tree, home, "inspect", str(out)))
                times[("validate", name)].append(timed(tree, home, "validate", str(mix)))
                times[("definitions", name)].append(timed(tree, home, "definitions"))
    print(f"{'command':<13} {'before s':>9} {'this s':>8} {'this ÷ before':>14}   {'CPU before':>10} {'CPU this':>9} ÷")
    for c in commands:
        old, new = times[(c, "before")], times[(c, "this")]
        wall = [statistics.median(x[0] for x in xs) for xs in (old, new)]
        cpu = [statistics.median(x[1] for x in xs) for xs in (old, new)]
        ratio = [statistics.median(b[i] / a[i] for a, b in zip(old, new, strict=True)) for i in (0, 1)]
        label = c if c == "definitions" else f"weir {c}"
        print(f"{label:<13} {wall[0]:>9.2f} {wall[1]:>8.2f} {ratio[0]:>14.3f}", end="   ")
        print(f"{cpu[0]:>10.2f} {cpu[1]:>9.2f} {ratio[1]:.3f}")
    print(f"{args.repeat} rounds; {load()}")


if __name__ == "__main__":
    main()
