"""Incremental rebuild of the demo mix after one file changed, vs the first (clean) build.

    python benchmarks/incremental.py            # the demo mix (goal: incremental ≥ 5× faster)
    python benchmarks/incremental.py --reps 3   # best of 3 for each figure

Both builds run in one warm process through ``pipelines.build.build_mix`` (what ``weir build`` runs), so
interpreter and import time count for neither. The incremental build is seeded with
``reuse_previous`` (what ``weir build`` does when the output exists). The changed file is the last prose
file, outside the BPE tokenizer's training sample (a file inside it changes the tokenizer and so,
legitimately, every document). The rebuilt result is checked byte for byte against a clean build.
"""

from __future__ import annotations

import argparse
import functools
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages: run as a script, only this folder is on the path


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()

    from mixing import load_mix
    from mixing.ingest.synthetic import write_demo_data
    from pipelines.build import build_mix
    from pipelines.kept_work import reuse_previous

    quiet = lambda _s: None  # noqa: E731
    with tempfile.TemporaryDirectory() as d:
        base = Path(d)
        write_demo_data(base / "demo-data")
        text = (
            (ROOT / "mixes" / "demo.yaml").read_text().replace("{mix_dir}/../build/demo-data", str(base / "demo-data"))
        )
        (base / "demo.yaml").write_text(text)
        mix = load_mix(base / "demo.yaml")
        build_mix(mix, base / "warmup", say=quiet)  # imports, Dagster's first run, page cache

        firsts: list[float] = []
        incrs: list[float] = []
        last = sorted((base / "demo-data" / "prose").glob("*.txt"))[-1]
        for rep in range(a.reps):
            first, incr = base / f"first-{rep}", base / f"incr-{rep}"
            firsts.append(_timed(functools.partial(build_mix, mix, first, say=quiet)))
            last.write_text(last.read_text() + f" One more sentence, edit {rep}.\n")

            def rebuild(first: Path = first, incr: Path = incr) -> None:
                reuse_previous(first, incr)
                build_mix(mix, incr, say=quiet)

            incrs.append(_timed(rebuild))
            clean = base / f"clean-{rep}"
            build_mix(mix, clean, say=quiet)
            for src in mix.sources:
                for f in ("docs.parquet", "quarantine.jsonl"):
                    a_, b_ = incr / "sources" / src / f, clean / "sources" / src / f
                    assert a_.read_bytes() == b_.read_bytes(), f"{src}/{f} differs from a clean build"
                for a_ in (incr / "sources" / src / "chunks").glob("*/tokens.bin"):  # what the index points at
                    b_ = clean / a_.relative_to(incr)
                    assert a_.read_bytes() == b_.read_bytes(), f"{a_.relative_to(incr)} differs from a clean build"
            for shard in (clean / "shards").iterdir():
                assert shard.read_bytes() == (incr / "shards" / shard.name).read_bytes(), shard.name
            shutil.rmtree(clean)
        first_s, incr_s = min(firsts), min(incrs)
        print(f"demo mix: first build {first_s:.2f} s, incremental rebuild after one changed file {incr_s:.2f} s")
        print(f"speedup {first_s / incr_s:.1f}× (goal ≥ 5×); the rebuilt result equals a clean build byte for byte")


if __name__ == "__main__":
    main()
