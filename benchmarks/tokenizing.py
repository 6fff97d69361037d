"""Tokenizing pipeline throughput vs the raw tokenizer, and peak memory vs source size.

    python benchmarks/tokenizing.py               # default: 4 MB of mixed code + prose, 1 and 2 threads
    python benchmarks/tokenizing.py --mb 50       # bigger run

For each tokenizer (the trained byte-level BPE, and the real ones in ../shared/tokenizers: DeepSeek's
tokenizer.json and tiktoken o200k_base, skipped when absent) and each thread count, one fresh process
(RAYON_NUM_THREADS and tiktoken's num_threads are fixed per process) measures, on the same text:

- raw: the tokenizer's own ``encode_batch`` over every document (texts already in memory; best case);
- pipeline: ``mixing.ingest.documents.tokenize_source`` over the same documents stored as jsonl files: read,
  parse, render, tokenize, write the chunks (``tokens.bin`` each) and ``docs.parquet``/``quarantine.jsonl``.

``tokenize_ratio`` = pipeline bytes/s ÷ raw bytes/s (docs/design.md; goal ≥ 0.85). Each raw variant runs once to
pick the fastest call; then that call and the pipeline alternate, R P R P … R (``--reps`` pipeline runs),
and each pipeline run is paired with the mean of the raw runs just before and after it. The goal is judged
on the median of those paired ratios (the machine is shared: a load change between two runs hits both
sides of a pair alike); their range is printed as the spread, and ``best/best`` is the fastest pipeline
run over the fastest raw run. Then the peak resident memory of tokenizing a source of ``--mb`` MB and one
10× larger, each in its own process (goal: about the same; memory is bounded by the batch, not the source).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages: run as a script, only this folder is on the path
SHARED = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()), None)
EOS = "<|endoftext|>"

if TYPE_CHECKING:
    from mixing.ingest.tokenizer import TextTokenizer


def _texts(mb: float) -> list[str]:
    """Deterministic documents: the standard library's .py files and demo prose, alternating, ``mb`` MB."""
    from mixing.ingest.synthetic import write_demo_data

    code = [p.read_text(errors="replace") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))]
    with tempfile.TemporaryDirectory() as d:
        write_demo_data(Path(d), prose_docs=1500, qa_records=10)
        prose = [p.read_text() for p in sorted(Path(d, "prose").glob("*.txt"))]
    out, size, i = [], 0, 0
    while size < mb * 1e6:
        t = code[i % len(code)] if i % 2 else prose[i % len(prose)]
        out.append(t)
        size += len(t.encode())
        i += 1
    return out


def _write_jsonl(texts: list[str], folder: Path, files: int = 8) -> list[str]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for k in range(files):
        p = folder / f"part-{k:03d}.jsonl"
        with p.open("w") as f:
            for t in texts[k::files]:
                f.write(json.dumps({"text": t}) + "\n")
        paths.append(str(p))
    return paths


def _batched(fn: Callable[[list[str]], Any]) -> Callable[[list[str]], None]:
    """The raw call on ~1 MB slices of the texts (the pipeline's batch size), as a raw variant too."""

    def run(texts: list[str]) -> None:
        start, size = 0, 0
        for i, t in enumerate(texts):
            size += len(t)
            if size >= 1 << 20 or i == len(texts) - 1:
                fn(texts[start : i + 1])
                start, size = i + 1, 0

    return run


def _tokenizer(kind: str, work: Path) -> tuple[TextTokenizer, dict[str, Callable[[list[str]], Any]]]:
    """(pipeline tokenizer, raw encode_batch callable) for one kind."""
    from mixing.ingest.tokenizer import load_tokenizer, prepare_tokenizer
    from mixing.mixfile.mix import TokenizerSpec

    if kind == "tiktoken_o200k":
        import tiktoken

        enc = tiktoken.get_encoding("o200k_base")
        threads = int(os.environ["RAYON_NUM_THREADS"])
        tok = load_tokenizer(TokenizerSpec(kind="tiktoken", name="o200k_base"), work)
        whole = lambda texts: enc.encode_ordinary_batch(texts, num_threads=threads)  # noqa: E731
        return tok, {"encode_ordinary_batch": whole, "encode_ordinary_batch/1MB": _batched(whole)}
    from tokenizers import Tokenizer

    if kind == "bpe":
        path = work / "bpe.json"
    else:
        assert SHARED is not None, "main runs deepseek only where ../shared holds its tokenizer.json"
        path = SHARED / "tokenizers" / "deepseek_tokenizer.json"
    eos = EOS if kind == "bpe" else "<｜end▁of▁sentence｜>"
    raw = Tokenizer.from_file(str(path))
    tok = prepare_tokenizer(
        TokenizerSpec(kind="hf", path=str(path), eos_token=eos), work / f"tok-{kind}-{os.getpid()}", []
    )
    fast = lambda texts: raw.encode_batch_fast(texts, add_special_tokens=False)  # noqa: E731
    return tok, {
        "encode_batch": lambda texts: raw.encode_batch(texts, add_special_tokens=False),
        "encode_batch_fast": fast,
        "encode_batch_fast/1MB": _batched(fast),
    }


def worker(kind: str, work: Path, reps: int) -> dict[str, object]:
    """Raw vs pipeline on the corpus in ``work`` (run in a fresh process per thread count)."""
    import numpy as np
    import polars as pl

    from mixing.ingest.documents import tokenize_source
    from mixing.mixfile.mix import SourceSpec

    texts = json.loads((work / "texts.json").read_text())
    paths = sorted(str(p) for p in (work / "jsonl").glob("*.jsonl"))
    nbytes = sum(len(t.encode()) for t in texts)
    tok, raws = _tokenizer(kind, work)
    for raw in raws.values():
        raw(texts[:50])  # warm the thread pool
    spec = SourceSpec(uri="unused", format="jsonl")
    index = pl.DataFrame(
        {"path": paths, "fingerprint": [None] * len(paths)}, schema={"path": pl.String, "fingerprint": pl.String}
    )

    def timed(fn: Callable[[], Any]) -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    def pipeline(rep: int) -> float:
        t = time.perf_counter()
        r = tokenize_source("bench", spec, index, tok, work / f"out-{kind}-{os.getpid()}-{rep}")
        took = time.perf_counter() - t
        assert r.docs_kept == len(texts) and r.bytes_in == nbytes, (r.docs_kept, len(texts))
        return took

    tokenize_source("warm", spec, index.head(1), tok, work / f"out-{kind}-{os.getpid()}-warm")  # lazy imports
    # Once each raw variant, to pick the fastest call (encode_batch_fast skips offsets: the strict ceiling).
    best = {name: timed(functools.partial(raw, texts)) for name, raw in raws.items()}
    raw_name = min(best, key=best.__getitem__)
    fastest = raws[raw_name]
    # Then raw and pipeline interleaved, R P R P ... R: each pipeline run is paired with the mean of the
    # raw runs right before and after it, so a load change on the shared machine hits both sides alike.
    raw_runs = [timed(lambda: fastest(texts))]
    pipe_runs: list[float] = []
    for rep in range(reps):
        pipe_runs.append(pipeline(rep))
        raw_runs.append(timed(lambda: fastest(texts)))
    best[raw_name] = min(best[raw_name], *raw_runs)
    paired = sorted((a + b) / 2 / p for a, b, p in zip(raw_runs[:-1], raw_runs[1:], pipe_runs, strict=True))
    raw_mb, pipe_mb = nbytes / best[raw_name] / 1e6, nbytes / min(pipe_runs) / 1e6
    return {
        "raw": raw_name,
        "raw_mb_s": raw_mb,
        "pipeline_mb_s": pipe_mb,
        "tokenize_ratio": pipe_mb / raw_mb,
        "paired_median": float(np.median(paired)),
        "paired_min": paired[0],
        "paired_max": paired[-1],
    }


def memory_worker(kind: str, work: Path, folder: str) -> dict[str, float]:
    """Peak RSS (MB) of tokenizing the jsonl files in ``work/folder``, and before starting."""
    import polars as pl

    from mixing.ingest.documents import tokenize_source
    from mixing.mixfile.mix import SourceSpec

    tok, _raws = _tokenizer(kind, work)
    paths = sorted(str(p) for p in (work / folder).glob("*.jsonl"))
    index = pl.DataFrame({"path": paths}, schema={"path": pl.String})
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    r = tokenize_source("mem", SourceSpec(uri="unused", format="jsonl"), index, tok, work / f"out-mem-{folder}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    mb = sum(Path(p).stat().st_size for p in paths) / 1e6
    return {"source_mb": mb, "docs": r.docs_kept, "peak_rss_mb": peak, "rss_before_mb": before}


def _spawn(args: list[str], threads: int) -> dict[str, Any]:
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
    if SHARED is not None:
        env.setdefault("TIKTOKEN_CACHE_DIR", str(SHARED / "tokenizers" / "tiktoken_cache"))
    out = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise SystemExit(f"worker {args} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=4.0, help="MB of text per throughput run and small memory source")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--reps", type=int, default=5, help="pipeline runs per figure, interleaved with raw runs")
    ap.add_argument("--worker", nargs=2, metavar=("KIND", "WORK"), help=argparse.SUPPRESS)
    ap.add_argument("--memory", nargs=3, metavar=("KIND", "WORK", "FOLDER"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker[0], Path(a.worker[1]), a.reps)))
        return
    if a.memory:
        print(json.dumps(memory_worker(a.memory[0], Path(a.memory[1]), a.memory[2])))
        return

    from mixing.ingest.tokenizer import train_bpe

    kinds = ["bpe"]
    if SHARED is not None and (SHARED / "tokenizers" / "deepseek_tokenizer.json").exists():
        kinds += ["deepseek", "tiktoken_o200k"]
    else:
        print("../shared/tokenizers is absent: only the trained BPE is measured")
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        texts = _texts(a.mb)
        (work / "texts.json").write_text(json.dumps(texts))
        _write_jsonl(texts, work / "jsonl")
        train_bpe(iter(texts[:400]), 8192, work / "bpe.json")
        mb = sum(len(t.encode()) for t in texts) / 1e6
        print(f"text: {len(texts):,} documents, {mb:.1f} MB (stdlib code + demo prose), as 8 jsonl files")
        head = f"{'tokenizer':<16}{'threads':>8}  {'fastest raw call':<26}{'raw MB/s':>9}{'pipeline MB/s':>15}"
        print(f"{head}{'best/best':>11}{'paired median':>15}{'paired range':>15}  goal ≥ 0.85")
        for kind in kinds:
            for th in a.threads:
                r = _spawn(["--worker", kind, str(work), "--reps", str(a.reps)], th)
                ok = "ok" if r["paired_median"] >= 0.85 else "BELOW GOAL"
                row = f"{kind:<16}{th:>8}  {r['raw']:<26}{r['raw_mb_s']:>9.2f}{r['pipeline_mb_s']:>15.2f}"
                spread = f"{r['paired_min']:.2f}–{r['paired_max']:.2f}"
                print(f"{row}{r['tokenize_ratio']:>11.3f}{r['paired_median']:>15.3f}{spread:>15}  {ok}")
        _write_jsonl(texts * 10, work / "jsonl10x")
        print("peak memory (bpe, 1 thread), each source in a fresh process:")
        for folder in ("jsonl", "jsonl10x"):
            r = _spawn(["--memory", "bpe", str(work), folder], 1)
            print(
                f"  source {r['source_mb']:8.1f} MB, {r['docs']:>8,} docs: peak RSS {r['peak_rss_mb']:7.1f} MB "
                f"(before tokenizing {r['rss_before_mb']:.1f} MB)"
            )


if __name__ == "__main__":
    main()
