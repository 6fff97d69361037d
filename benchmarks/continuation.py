"""A continuation (``weir build NEW --continue BASE --at N``) beside a full build of NEW, on the demo corpus.

    python benchmarks/continuation.py                 # main phase of 16M tokens, 64 sequences a step, best of 2
    python benchmarks/continuation.py --main-tokens 4M --global-batch 16 --reps 1

BASE is the demo mix with a larger main phase and batch (the demo corpus repeated: ``max_epochs`` raised); NEW
changes only the anneal's mixture (what an eval asks for), and the continuation switches at the anneal's first
step N. Both timed builds run in one warm process through ``pipelines.build.build_mix`` (what ``weir build``
runs) into folders seeded with BASE's tokenized chunks and tokenizer (``reuse_previous``, as ``weir build``
seeds from the previous output), so both reuse the tokenizing and the figures compare what differs: planning,
packing and writing. Printed: both build times, the share of steps at or past N, the continuation's time over
(that share × the full build's), its constant (what is left over that share), the bytes of shard files it wrote
and of BASE's it reused (hard links, 0 bytes rewritten), the prefix check (steps 0..N−1 digest-equal to BASE's),
and ``mixture_error`` per 10-step window and per phase of both builds (the continuation's windows across N
included), with the load average."""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages: run as a script, only this folder is on the path

NEW_ANNEAL = "mixture: {prose: 0.1, code: 0.3, qa: 0.6}"


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _shard_bytes(folder: Path, base_inodes: set[int]) -> tuple[int, int]:
    """(bytes of files written here, bytes of the base's files linked here) in ``folder``."""
    written = reused = 0
    for p in folder.iterdir():
        st = p.stat()
        if st.st_ino in base_inodes:
            reused += st.st_size
        else:
            written += st.st_size
    return written, reused


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--main-tokens", default="16M", help="the main phase's tokens (the demo's is 1M)")
    ap.add_argument("--global-batch", type=int, default=64, help="sequences per step (the demo's is 16)")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()

    import numpy as np

    from contract.digests import read_step_digests
    from contract.shards import ShardSet
    from mixing import load_mix
    from mixing.ingest.synthetic import write_demo_data
    from mixing.report import inspect_build
    from pipelines.build import build_mix
    from pipelines.kept_work import reuse_previous

    quiet = lambda _s: None  # noqa: E731
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        write_demo_data(tmp / "demo-data")
        text = (ROOT / "mixes" / "demo.yaml").read_text()
        text = text.replace("{mix_dir}/../build/demo-data", str(tmp / "demo-data"))
        text = text.replace("tokens: 1M", f"tokens: {a.main_tokens}").replace("max_epochs: 4", "max_epochs: 100")
        text = text.replace("global_batch: 16", f"global_batch: {a.global_batch}")
        (tmp / "base.yaml").write_text(text)
        new_text = text.replace("mixture: {prose: 0.2, code: 0.3, qa: 0.5}", NEW_ANNEAL)
        assert new_text != text, "the demo's anneal mixture moved: update NEW_ANNEAL's target"
        (tmp / "new.yaml").write_text(new_text)
        base_mix, new_mix = load_mix(tmp / "base.yaml"), load_mix(tmp / "new.yaml")
        at = sum(base_mix.phase_steps[:-1])  # the anneal's first step
        build_mix(base_mix, tmp / "warmup", say=quiet)  # imports, Dagster's first run, page cache
        build_mix(base_mix, tmp / "base", say=quiet)
        base_inodes = {p.stat().st_ino for p in (tmp / "base" / "shards").iterdir()}

        fulls: list[float] = []
        conts: list[float] = []
        ones: list[float] = []
        last = base_mix.total_steps - 1
        for rep in range(a.reps):
            full, cont, one = tmp / f"full-{rep}", tmp / f"cont-{rep}", tmp / f"one-{rep}"
            for folder in (full, cont, one):
                reuse_previous(tmp / "base", folder)
            fulls.append(_timed(functools.partial(build_mix, new_mix, full, say=quiet)))
            continued = new_mix.continuing(str(tmp / "base"), at)
            conts.append(_timed(functools.partial(build_mix, continued, cont, say=quiet)))
            one_step = base_mix.continuing(str(tmp / "base"), last)  # what any continuation costs: its constant
            ones.append(_timed(functools.partial(build_mix, one_step, one, say=quiet)))

        full, cont = tmp / "full-0", tmp / "cont-0"
        steps, t_full, t_cont, t_one = new_mix.total_steps, min(fulls), min(conts), min(ones)
        share = (steps - at) / steps
        written, reused = _shard_bytes(cont / "shards", base_inodes)
        full_written = sum(p.stat().st_size for p in (full / "shards").iterdir())
        dc, db = read_step_digests(ShardSet(cont / "shards")), read_step_digests(ShardSet(tmp / "base" / "shards"))
        assert dc is not None and db is not None
        prefix_equal = bool(np.array_equal(dc[:at], db[:at]))
        rc, rf = inspect_build(cont), inspect_build(full)
        load = os.getloadavg()
        print(f"demo corpus, main {a.main_tokens} tokens: {steps} steps, switch at step {at} (the anneal)")
        print(f"full build of NEW     {t_full:6.2f} s   shards written {full_written / 1e6:8.1f} MB")
        print(
            f"continuation at {at:<4}  {t_cont:6.2f} s   shards written {written / 1e6:8.1f} MB, "
            f"BASE's reused {reused / 1e6:.1f} MB (0 bytes rewritten)"
        )
        print(f"continuation of the last step alone (the constant) {t_one:.2f} s")
        bound = share * t_full + t_one
        print(
            f"steps ≥ N: {share:.3f} of the run; goal continuation ≤ share × full + constant = {bound:.2f} s: "
            f"{'met' if t_cont <= bound else 'missed'} ({t_cont:.2f} s)"
        )
        print(f"prefix check: steps 0..{at - 1} digest-equal to BASE's: {prefix_equal}")
        for name, r in (("full", rf), ("continuation", rc)):
            me = r.mixture_error
            window = f"{me.window:.4f} per {me.window_steps}-step window"
            print(f"mixture_error {name:13s} {window}, {me.phase:.4f} per phase")
        print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} ({os.cpu_count()} cores); best of {a.reps}")
        shutil.rmtree(tmp / "warmup", ignore_errors=True)


if __name__ == "__main__":
    main()
