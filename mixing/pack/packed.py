"""Materialize a packing as shards, and summarize a finished build (what ``weir inspect`` prints)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np

from mixing.errors import WeirError
from mixing.format.layout import BuildLayout, write_json_atomic
from mixing.format.manifest import MANIFEST, ShardError, _first_line
from mixing.format.shards import ShardSet, token_dtype, write_shards
from mixing.ingest.documents import DocumentSet, open_documents
from mixing.pack.packing import Packing
from mixing.plan.mixture import MixtureError, shards_mixture_error
from mixing.spec.mixfile import Mix

__all__ = [
    "REPORT",
    "BuildError",
    "build_mixture_error",
    "gather_tokens",
    "inspect_build",
    "saved_report",
    "write_packed",
    "write_report",
]

_SHARD_TOKENS = 1 << 24  # ~32-64 MB of tokens per shard
_SLICE_TOKENS = 256  # segments this long are copied as slices; shorter ones in one vectorized gather


class BuildError(WeirError, RuntimeError):
    """A build's DuckDB file is missing, unreadable, or does not match its shards."""


def gather_tokens(
    packing: Packing, sources: dict[str, DocumentSet], lo: int, hi: int, dtype: Any, pad_id: int
) -> np.ndarray:
    """Tokens of sequences ``lo..hi-1`` of ``packing``, array [hi-lo, S] of ``dtype``, padded with ``pad_id``.

    Short segments go through one fancy-index gather per source; long ones (≥ ``_SLICE_TOKENS``, hence
    few per sequence) are slice copies, which avoids index arrays as large as the tokens themselves.
    """
    seq_len = packing.seq_len
    out = np.full((hi - lo, seq_len), pad_id, dtype=dtype)
    s0, s1 = int(packing.seg_offsets[lo]), int(packing.seg_offsets[hi])
    segs = packing.segments[s0:s1]
    if not len(segs):
        return out
    counts = np.diff(packing.seg_offsets[lo : hi + 1])
    seq_of = np.repeat(np.arange(hi - lo, dtype=np.int64), counts)
    ends = np.cumsum(segs[:, 3])
    starts_all = ends - segs[:, 3]  # start of each segment in the concatenation of this block's segments
    first_seg = np.cumsum(counts) - counts
    seq_base = np.repeat(starts_all[np.minimum(first_seg, len(segs) - 1)], counts)
    dst = seq_of * seq_len + (starts_all - seq_base)  # flat slot of each segment's first token
    flat = out.reshape(-1)
    long = segs[:, 3] >= _SLICE_TOKENS
    for k, name in enumerate(packing.sources):
        mine = segs[:, 0] == k
        if not mine.any():
            continue
        ds = sources[name]
        offsets = ds.docs["offset"].to_numpy()
        src0 = np.zeros(len(segs), np.int64)
        src0[mine] = offsets[segs[mine, 1]] + segs[mine, 2]
        # long segments: one slice copy each (few of them); short ones: one fancy-index gather in all
        big = mine & long
        for d, s, n in zip(dst[big].tolist(), src0[big].tolist(), segs[big, 3].tolist(), strict=True):
            flat[d : d + n] = ds.tokens[s : s + n]
        short = mine & ~long
        length = segs[short, 3]
        run = np.arange(int(length.sum()), dtype=np.int64) - np.repeat(np.cumsum(length) - length, length)
        flat[np.repeat(dst[short], length) + run] = ds.tokens[np.repeat(src0[short], length) + run]
    return out


def write_packed(
    mix: Mix,
    layout: BuildLayout,
    packing: Packing,
    tokenizer_fingerprint: str,
    vocab_size: int,
    pad_id: int,
    *,
    eos_id: int | None = None,
    on_shard: Callable[[int], None] = lambda _k: None,
    out: str | Path | None = None,
    storage_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Gather each sequence's tokens from the sources and write shards plus manifest; return the manifest.

    Shards go to ``out`` (a folder or fsspec URL such as ``s3://bucket/prefix``; default the build's
    ``shards/``), with ``storage_options`` for the filesystem.

    The manifest's ``per_source`` records, for each source: ``tokens_planned`` (Σ planned unit lengths),
    ``tokens_packed``, ``tokens_dropped`` (planned = packed + dropped) and ``documents_packed``.
    """
    seq_len = packing.seq_len
    dtype = token_dtype(vocab_size)
    docsets = {name: open_documents(layout.source_dir(name)) for name in packing.sources}
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        planned = dict(con.sql("SELECT source, sum(length)::BIGINT FROM plan_units GROUP BY 1").fetchall())
        phases = con.sql(
            "SELECT phase, min(step)::BIGINT, count(DISTINCT step)::BIGINT FROM plan_quotas GROUP BY 1 ORDER BY 2"
        ).fetchall()
    per_source = {}
    for k, name in enumerate(packing.sources):
        seg = packing.segments[packing.segments[:, 0] == k]
        drop = packing.dropped[packing.dropped[:, 0] == k]
        per_source[name] = {
            "tokens_planned": int(planned.get(name, 0)),
            "tokens_packed": int(seg[:, 3].sum()),
            "tokens_dropped": int(drop[:, 3].sum()),
            "documents_packed": len(np.unique(seg[:, 1])),
            "documents_dropped": len(np.unique(drop[:, 1])),
        }
    manifest = {
        "mix": mix.name,
        "mix_fingerprint": mix.fingerprint(),
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "vocab_size": vocab_size,
        "pad_id": pad_id,
        "eos_id": eos_id,  # documents end with it (unless the mix says eos: false); pad_id differs when it can
        "seed": mix.seed,  # the mix's seed: the loader's default, so that one seed fixes the whole run
        "global_batch": mix.sequence.global_batch,
        "cost": mix.balance.cost.model_dump(),
        "micro_batches": mix.balance.micro_batches,
        "max_tokens": mix.balance.max_tokens,
        "regroup": mix.balance.regroup.model_dump() if mix.balance.regroup else None,
        "steps": mix.total_steps,
        "sources": list(packing.sources),
        "phases": [{"phase": p, "first_step": s, "steps": c} for p, s, c in phases],
        "per_source": per_source,
        "packing": {
            "algorithm": "best-fit-decreasing per step steered by per-source quota deficits, cost-aware ties, "
            "lookahead fill within phase"
        },
    }
    return write_shards(
        layout.shards_dir if out is None else out,
        lambda lo, hi: gather_tokens(packing, docsets, lo, hi, dtype, pad_id),
        packing.seq_step,
        packing.seg_offsets,
        packing.segments,
        max(1, _SHARD_TOKENS // seq_len),
        manifest,
        seg_cost=packing.seg_cost,
        seq_len=seq_len,
        on_shard=on_shard,
        storage_options=storage_options,
    )


def build_mixture_error(root: Path, shards: ShardSet | None = None) -> MixtureError:
    """``mixture_error`` of a finished build: its shards' tokens per step and source (what the trainer
    gets) against the plan's quotas in the build's DuckDB file (``shards`` default: the build's)."""
    layout = BuildLayout(root)
    shards = ShardSet(layout.shards_dir) if shards is None else shards
    quotas = _query(layout, lambda con: con.sql("SELECT step, phase, source, quota FROM plan_quotas").pl())
    planned = set(quotas["source"].to_list())
    steps = int(quotas["step"].max()) + 1 if len(quotas) else 0
    if not set(shards.manifest["sources"]) <= planned or (len(shards) and int(shards.steps.max()) >= steps):
        raise BuildError(
            f"{layout.duckdb}: its plan ({steps} steps of sources {sorted(planned)}) does not match "
            f"{shards.url}/{MANIFEST} ({shards.manifest.get('steps')} steps of sources {shards.manifest['sources']})"
        )
    return shards_mixture_error(shards, quotas)


def _query(layout: BuildLayout, read: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
    """``read(connection)`` on the build's DuckDB file, opened read-only; its failures as one BuildError line."""
    if not layout.duckdb.is_file():
        raise BuildError(f"{layout.duckdb}: missing; the build is incomplete, rebuild it")
    try:
        with duckdb.connect(str(layout.duckdb), read_only=True) as con:
            return read(con)
    except duckdb.Error as e:
        raise BuildError(f"{layout.duckdb}: cannot read it ({_first_line(e)}); rebuild") from None


_INSPECTED = ("mix", "steps", "global_batch", "sources", "per_source", "phases")  # fields weir build writes


def inspect_build(root: Path) -> dict[str, Any]:
    """Figures of a finished build, recomputed from its shards (not copied from the manifest).

    Keys: ``sequences``, ``steps``, ``seq_len``, ``tokens`` (real, non-padding), ``packing_efficiency``
    (tokens ÷ (sequences × S)), ``truncated_docs`` (documents ≤ S split ÷ documents packed),
    ``per_source`` (documents and tokens indexed; tokens planned, packed, dropped; documents packed),
    ``sequence_cost`` (spread of Σ cost per sequence: mean, max/mean, p95/mean, cv), ``segments_per_sequence``
    (mean, max), ``mixture_error`` (realized vs planned shares: ``window``, ``phase``, their goals, ``ok``,
    where the worst is, ``per_phase``), ``format_version``, ``dtype``, ``shards``, ``corrupt_files`` (shard
    files whose size or checksum does not match the manifest), ``file_problems`` (each of those → what is
    wrong), ``manifest_sealed`` (False for a manifest written before manifests carried their own checksum).

    Raises :class:`~mixing.format.shards.ShardError` or :class:`BuildError`, one line naming the file, when the
    manifest, a shard file or the DuckDB file cannot be read or does not fit; when a shard file also differs
    from its checksum, the error names that difference (the cause) rather than what it broke.
    """
    layout = BuildLayout(root)
    shards = ShardSet(layout.shards_dir)
    absent = [f for f in _INSPECTED if shards.manifest.get(f) is None]
    if absent:
        raise ShardError(f"{shards.url}/{MANIFEST}: lacks {absent}, which weir build writes; not a weir build")
    problems = shards.file_problems()
    try:
        report = _figures(layout, shards)
    except WeirError:
        if problems:
            raise ShardError("; ".join(f"{shards.url}/{n}: {why}" for n, why in problems.items())) from None
        raise
    return {**report, "corrupt_files": list(problems), "file_problems": problems, "manifest_sealed": shards.sealed}


def _figures(layout: BuildLayout, shards: ShardSet) -> dict[str, Any]:
    m = shards.manifest
    offs, allseg = shards.segments
    tokens = int(allseg[:, 3].sum())
    seq_len = int(m["seq_len"])

    def read(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, int]]]:
        docs = con.sql("SELECT source, doc_id, n_tokens FROM documents").fetchnumpy()
        per = "SELECT source, count(*), sum(n_tokens)::BIGINT FROM documents GROUP BY 1"
        return docs, {s: (d, t) for s, d, t in con.sql(per).fetchall()}

    docs_df, indexed = _query(layout, read)
    n_docs_total = split_total = 0
    per_source = {}
    for k, name in enumerate(m["sources"]):
        mine = allseg[allseg[:, 0] == k]
        sel = docs_df["source"] == name
        lengths = np.zeros(int(docs_df["doc_id"][sel].max()) + 1 if sel.any() else 0, np.int64)
        lengths[np.asarray(docs_df["doc_id"][sel], np.int64)] = np.asarray(docs_df["n_tokens"][sel], np.int64)
        if len(mine) and int(mine[:, 1].max()) >= len(lengths):
            raise BuildError(f"{layout.duckdb}: documents of {name!r} do not match the shards; rebuild")
        doc_len = lengths[mine[:, 1]] if len(mine) else np.zeros(0, np.int64)
        split = np.unique(mine[(doc_len <= seq_len) & (mine[:, 3] < doc_len), 1])
        packed_docs = len(np.unique(mine[:, 1]))
        n_docs_total += packed_docs
        split_total += len(split)
        per_source[name] = {
            **m["per_source"][name],
            "documents_indexed": indexed.get(name, (0, 0))[0],
            "tokens_indexed": indexed.get(name, (0, 0))[1],
            "tokens_packed": int(mine[:, 3].sum()),
            "documents_packed": packed_docs,
            "truncated_docs": len(split),
            "mean_doc_tokens": float(mine[:, 3].mean()) if len(mine) else 0.0,
        }
    n = len(shards)
    cost = shards.seq_cost
    mean_cost = float(cost.mean()) if n else 0.0
    counts = np.diff(offs)
    return {
        "mix": m["mix"],
        "format_version": m["format_version"],
        "dtype": m["dtype"],
        "shards": len(m["shards"]),
        "sequences": n,
        "steps": int(m["steps"]),
        "seq_len": seq_len,
        "global_batch": int(m["global_batch"]),
        "tokens": tokens,
        "packing_efficiency": tokens / (n * seq_len) if n else 0.0,
        "truncated_docs": split_total / n_docs_total if n_docs_total else 0.0,
        "tokens_dropped": int(sum(s.get("tokens_dropped", 0) for s in per_source.values())),
        "sequence_cost": {
            "mean": mean_cost,
            "max_over_mean": float(cost.max() / mean_cost) if mean_cost else 0.0,
            "p95_over_mean": float(np.percentile(cost, 95) / mean_cost) if mean_cost else 0.0,
            "cv": float(cost.std() / mean_cost) if mean_cost else 0.0,
        },
        "segments_per_sequence": {
            "mean": float(counts.mean()) if n else 0.0,
            "max": int(counts.max()) if n else 0,
        },
        "per_source": per_source,
        "mixture_error": build_mixture_error(layout.root, shards).report(),
        "phases": m["phases"],
    }


REPORT = "report.json"  # beside shards/: inspect_build's figures, computed once when the shards were written


def _report_digest(manifest_sha256: str, report: dict[str, Any]) -> str:
    text = json.dumps({"manifest_sha256": manifest_sha256, "report": report}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def write_report(root: Path, report: dict[str, Any]) -> None:
    """Save :func:`inspect_build`'s ``report`` of the build in ``root`` as ``root/report.json``.

    Tied to the manifest it describes (its ``manifest_sha256``) and checksummed, so :func:`saved_report`
    never returns figures of other shards or an edited file.
    """
    layout = BuildLayout(root)
    sealed = json.loads(layout.manifest.read_text()).get("manifest_sha256", "")
    write_json_atomic(
        layout.root / REPORT,
        {"manifest_sha256": sealed, "report": report, "report_sha256": _report_digest(sealed, report)},
    )


def saved_report(root: Path) -> dict[str, Any] | None:
    """The report :func:`write_report` saved for the build in ``root``, or None when it is absent, damaged,
    or not about the shards there now (then run :func:`inspect_build`). Hashes no shard file."""
    layout = BuildLayout(root)
    try:
        saved = json.loads((layout.root / REPORT).read_text())
        sealed = json.loads(layout.manifest.read_text()).get("manifest_sha256")
        report = saved["report"]
        ok = sealed and saved["manifest_sha256"] == sealed and saved["report_sha256"] == _report_digest(sealed, report)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return report if ok else None
