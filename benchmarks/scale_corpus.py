"""The corpus ``benchmarks/scale.py`` builds, the mix over it, and the chunks its sources split into.

- :func:`write_corpus`: ``mb`` MB of files in :data:`PARTS` equal parts, each with the sources of :data:`SHARES`
  (``prose`` and ``qa`` from :mod:`mixing.ingest.synthetic` as ~:data:`FILE_BYTES` jsonl files, ``code`` the
  standard library's ``.py`` files); deterministic for a given ``mb`` and Python (the stdlib files it copies),
  kept when the folder already holds one.
- :func:`write_mix`: the benchmark's mix YAML over some of the parts, planning :data:`TOKENS_PER_BYTE` tokens per
  input byte in one phase at S=8192, 64 sequences a step.
- :func:`chunk_sizes`, :func:`largest_chunk_docs`: a finished ``documents`` stage's chunks (MB of input files
  each; the documents of the largest), read from its build folder.
- :func:`chunk_bound`: the most the ``documents`` stage can gain on ``workers`` workers given those chunks.
"""

from __future__ import annotations

import json
import shutil
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = [
    "FILE_BYTES",
    "PARTS",
    "SHARES",
    "TOKENS_PER_BYTE",
    "chunk_bound",
    "chunk_sizes",
    "largest_chunk_docs",
    "write_corpus",
    "write_mix",
]

PARTS = 8
SHARES = {"prose": 0.5, "qa": 0.25, "code": 0.25}
FILE_BYTES = 1_000_000  # per jsonl file
TOKENS_PER_BYTE = 0.2  # planned tokens per byte of input: about 0.7 epoch of the corpus


def _write_jsonl(folder: Path, lines: list[str], budget: float, start: int) -> None:
    """``budget`` bytes of ``lines`` (cycled from ``start``) as ~:data:`FILE_BYTES` jsonl files in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    written, i, k = 0, start, 0
    while written < budget:
        size, out = 0, []
        while size < FILE_BYTES and written + size < budget:
            line = lines[i % len(lines)] + "\n"
            out.append(line)
            size += len(line.encode())
            i += 1
        (folder / f"part-{k:05d}.jsonl").write_text("".join(out))
        written, k = written + size, k + 1


def _copy_code(folder: Path, files: list[tuple[str, Path]], budget: float, start: int) -> None:
    """``budget`` bytes of the standard library's files (cycled from ``start``; copy ``n`` of a file in ``n/``)."""
    written, i = 0, start
    while written < budget:
        rel, src = files[i % len(files)]
        dst = folder / str(i // len(files)) / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        written, i = written + src.stat().st_size, i + 1


def write_corpus(root: Path, mb: float) -> dict[str, Any]:
    """The corpus of ``mb`` MB under ``root`` (kept when ``root/corpus.json`` says it is there); its figures."""
    done = root / "corpus.json"
    if done.exists():
        return json.loads(done.read_text())  # type: ignore[no-any-return]
    from mixing.ingest.synthetic import write_demo_data

    t = time.perf_counter()
    with tempfile.TemporaryDirectory() as d:
        write_demo_data(Path(d), prose_docs=2000, qa_records=15000)
        prose = [json.dumps({"text": p.read_text()}) for p in sorted(Path(d, "prose").glob("*.txt"))]
        qa = [line for p in sorted(Path(d, "qa").glob("*.jsonl")) for line in p.read_text().splitlines()]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    code = [
        (str(p.relative_to(stdlib)), p)
        for p in sorted(stdlib.rglob("*.py"))
        if not {"site-packages", "dist-packages"} & set(p.parts) and p.is_file()
    ]
    part = mb * 1e6 / PARTS
    for k in range(PARTS):
        base = root / f"part-{k}"
        _write_jsonl(base / "prose", prose, part * SHARES["prose"], start=k * 251)
        _write_jsonl(base / "qa", qa, part * SHARES["qa"], start=k * 1877)
        _copy_code(base / "code", code, part * SHARES["code"], start=k * 223)
    info: dict[str, Any] = {"mb": mb, "seconds": time.perf_counter() - t, "sources": {}}
    for name in SHARES:
        files = [p for k in range(PARTS) for p in (root / f"part-{k}" / name).rglob("*") if p.is_file()]
        info["sources"][name] = {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}
    done.write_text(json.dumps(info))
    return info


def write_mix(
    path: Path, data: Path, parts: str, tokenizer: str, input_bytes: int, files: str = "*", code: str = "**/*.py"
) -> None:
    """The benchmark's mix over the corpus parts ``part-<parts>`` (globs: ``files`` the jsonl files' stems,
    ``code`` the code files), planning 0.2 tokens per input byte."""
    tok = "{kind: tiktoken, name: o200k_base}" if tokenizer == "tiktoken" else "{kind: bpe, vocab_size: 32768}"
    mixture = ", ".join(f"{name}: {share}" for name, share in SHARES.items())
    path.write_text(
        f"""name: scale
seed: 1
tokenizer: {tok}
sequence: {{length: 8192, global_batch: 64}}
sources:
  prose: {{uri: "{data}/part-{parts}/prose/{files}.jsonl", format: jsonl}}
  qa: {{uri: "{data}/part-{parts}/qa/{files}.jsonl", format: jsonl, template: "Q: {{question}}\\nA: {{answer}}"}}
  code: {{uri: "{data}/part-{parts}/code/{code}", format: text}}
curriculum:
  - {{phase: main, tokens: {int(input_bytes * TOKENS_PER_BYTE)}, mixture: {{{mixture}}}}}
balance: {{cost: {{attention: 1.0, linear: 8192}}}}
"""
    )


def largest_chunk_docs(mix: Any, layout: Any) -> int:
    """Documents in the largest chunk of any source (what the driver holds at once while it writes an index)."""
    import polars as pl

    return max(
        int(
            pl.read_parquet(layout.source_dir(n) / "docs.parquet", columns=["chunk"])["chunk"]  # type: ignore[arg-type]  # polars types .max() as any scalar
            .value_counts()["count"]
            .max()
            or 0
        )
        for n in mix.sources
    )


def chunk_sizes(mix: Any, layout: Any) -> dict[str, list[float]]:
    """MB of input files in each chunk of each source (the unit of work a Ray task tokenizes)."""
    import polars as pl

    from mixing.ingest.chunks import chunk_groups
    from mixing.ingest.tokenizer import load_tokenizer

    tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    out = {}
    for name, spec in sorted(mix.sources.items()):
        files = pl.read_parquet(layout.source_dir(name) / "index.parquet")
        out[name] = [sum(row["size"] for row in group) / 1e6 for group, _key in chunk_groups(files, tok, spec)]
    return out


def chunk_bound(chunk_mb: dict[str, list[float]], workers: int) -> float:
    """The most the documents stage can gain on ``workers`` workers over one, given its chunks: every source's
    chunks in one queue (as ``weir build`` submits them ahead: the sources in order, each source's chunks in
    order) to the first free worker, each taking time in proportion to its MB, with no other cost."""
    free = [0.0] * workers
    for sizes in chunk_mb.values():
        for mb in sizes:
            free[free.index(min(free))] += mb
    return sum(free) / max(free)
