"""A finished build's figures (what ``weir inspect`` and ``weir build`` print), typed, and their saved copy.

:func:`inspect_build` recomputes them from the shards (every file hashed) and the build's DuckDB file into a
:class:`BuildReport`; the ``packed_shards`` asset saves that once as ``report.json`` (:func:`write_report`),
tied to the manifest's checksum, so that :func:`saved_report` can hand it back without hashing anything.
``BuildReport.as_json()`` is the JSON object ``weir inspect --json`` prints and ``report.json`` holds.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, ValidationError

from contract.atomic import write_json_atomic
from contract.errors import WeirError, first_line
from contract.manifest import MANIFEST, ShardError, parse_manifest
from contract.record import Lineage, PhaseSpan, Regroup
from contract.shards import ShardSet
from mixing.output.layout import BuildLayout
from mixing.plan.mixture import MixtureError, MixtureReport, shards_mixture_error

__all__ = [
    "MIN_PACKING_EFFICIENCY",
    "REPORT",
    "BuildError",
    "BuildReport",
    "SegmentsPerSequence",
    "SequenceCost",
    "SourceReport",
    "StreamMixtureReport",
    "build_mixture_error",
    "build_quotas",
    "inspect_build",
    "saved_report",
    "write_report",
]

REPORT = "report.json"  # beside shards/: inspect_build's figures, computed once when the shards were written
MIN_PACKING_EFFICIENCY = 0.995  # the goal of BuildReport.packing_efficiency (docs/design.md)


class BuildError(WeirError, RuntimeError):
    """A build's DuckDB file is missing, unreadable, or does not match its shards."""


class _Report(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceReport(_Report):
    """One source's row: what the manifest recorded (tokens planned, dropped, documents dropped; None in
    format 1 builds) and what the shards and documents hold now (indexed, packed, split, mean length)."""

    tokens_planned: int
    tokens_packed: int
    tokens_dropped: int
    documents_packed: int
    documents_dropped: int | None = None
    documents_indexed: int
    tokens_indexed: int
    truncated_docs: int
    mean_doc_tokens: float


class SequenceCost(_Report):
    """Spread of Σ cost per sequence (the build's cost model): mean, max/mean, p95/mean, cv."""

    mean: float
    max_over_mean: float
    p95_over_mean: float
    cv: float


class SegmentsPerSequence(_Report):
    """Documents (segments) per sequence: mean and max."""

    mean: float
    max: int


class StreamMixtureReport(MixtureReport):
    """:class:`~mixing.plan.mixture.MixtureReport` of the training steps the loader makes, with the
    ``regroup`` (window, period, slack) it was measured under (:func:`assets.stream.stream_report`)."""

    regroup: Regroup


class BuildReport(_Report):
    """A build's figures, recomputed from its shards (not copied from the manifest).

    ``sequences``, ``steps``, ``seq_len``, ``global_batch``, ``tokens`` (real, non-padding),
    ``packing_efficiency`` (tokens ÷ (sequences × S)), ``truncated_docs`` (documents ≤ S split ÷ documents
    packed), ``tokens_dropped`` (at phase ends), ``per_source`` (:class:`SourceReport`), ``sequence_cost``,
    ``segments_per_sequence``, ``mixture_error`` (realized vs planned shares), ``phases``,
    ``format_version``, ``dtype``, ``shards`` (how many), ``corrupt_files`` (shard files whose size or
    checksum does not match the manifest), ``file_problems`` (each of those → what is wrong),
    ``manifest_sealed`` (False for a manifest written before manifests carried their own checksum), and
    ``mixture_error_stream`` when the mix file regroups steps (None: the stream is the build's steps), and
    ``lineage``: the builds this one continues (:class:`contract.record.Lineage`, oldest first).
    """

    mix: str
    format_version: int
    dtype: str
    shards: int
    sequences: int
    steps: int
    seq_len: int
    global_batch: int
    tokens: int
    packing_efficiency: float
    truncated_docs: float
    tokens_dropped: int
    sequence_cost: SequenceCost
    segments_per_sequence: SegmentsPerSequence
    per_source: dict[str, SourceReport]
    mixture_error: MixtureReport
    phases: tuple[PhaseSpan, ...]
    corrupt_files: tuple[str, ...]
    file_problems: dict[str, str]
    manifest_sealed: bool
    mixture_error_stream: StreamMixtureReport | None = None
    lineage: tuple[Lineage, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """The JSON object ``weir inspect --json`` prints (fields that are None left out)."""
        return self.model_dump(mode="json", exclude_none=True)


def build_mixture_error(root: Path | BuildLayout, shards: ShardSet | None = None) -> MixtureError:
    """``mixture_error`` of a finished build: its shards' tokens per step and source (what the trainer
    gets) against the plan's quotas in the build's DuckDB file (``shards`` default: the build's)."""
    layout = BuildLayout.of(root)
    shards = layout.shard_set() if shards is None else shards
    quotas = build_quotas(layout, bool(shards.manifest.lineage))
    planned = set(quotas["source"].to_list())
    steps = int(quotas["step"].max() or 0) + 1 if len(quotas) else 0  # type: ignore[arg-type]
    sources = list(shards.manifest.sources or ())
    if not set(sources) <= planned or (len(shards) and int(shards.steps.max()) >= steps):
        raise BuildError(
            f"{layout.duckdb}: its plan ({steps} steps of sources {sorted(planned)}) does not match "
            f"{shards.url}/{MANIFEST} ({shards.manifest.steps} steps of sources {sources})"
        )
    return shards_mixture_error(shards, quotas)


def build_quotas(layout: BuildLayout, continued: bool = False) -> pl.DataFrame:
    """The plan's quotas of every step of the build (step, phase, source, quota): the DuckDB table
    ``plan_quotas``; of a continuation (``continued``), whose table starts at its switch, ``plan/quotas.parquet``,
    which holds its base's steps before the switch too."""
    path = layout.plan_dir / "quotas.parquet"
    if continued and path.is_file():
        return pl.read_parquet(path, columns=["step", "phase", "source", "quota"])
    return _query(layout, lambda con: con.sql("SELECT step, phase, source, quota FROM plan_quotas").pl())


def _query(layout: BuildLayout, read: Callable[[duckdb.DuckDBPyConnection], Any]) -> Any:
    """``read(connection)`` on the build's DuckDB file, opened read-only; its failures as one BuildError line."""
    if not layout.duckdb.is_file():
        raise BuildError(f"{layout.duckdb}: missing; the build is incomplete, rebuild it")
    try:
        with duckdb.connect(str(layout.duckdb), read_only=True) as con:
            return read(con)
    except duckdb.Error as e:
        raise BuildError(f"{layout.duckdb}: cannot read it ({first_line(e)}); rebuild") from None


def inspect_build(root: Path | BuildLayout) -> BuildReport:
    """The figures of the finished build in ``root`` (see :class:`BuildReport`), every shard file hashed.

    Raises :class:`~contract.shards.ShardError` or :class:`BuildError`, one line naming the file, when the
    manifest, a shard file or the DuckDB file cannot be read or does not fit; when a shard file also differs
    from its checksum, the error names that difference (the cause) rather than what it broke.
    """
    layout = BuildLayout.of(root)
    shards = layout.shard_set()
    absent = shards.manifest.lacks()
    if absent:
        raise ShardError(f"{shards.url}/{MANIFEST}: lacks {absent}, which weir build writes; not a weir build")
    problems = shards.file_problems()
    try:
        return _figures(layout, shards, problems)
    except WeirError:
        if problems:
            raise ShardError("; ".join(f"{shards.url}/{n}: {why}" for n, why in problems.items())) from None
        raise


def _figures(layout: BuildLayout, shards: ShardSet, problems: dict[str, str]) -> BuildReport:
    m = shards.manifest
    assert m.mix is not None and m.steps is not None and m.global_batch is not None  # m.lacks() is empty
    assert m.sources is not None and m.per_source is not None and m.phases is not None
    offs, allseg = shards.segments
    tokens = int(allseg[:, 3].sum())
    seq_len = m.seq_len

    def read(con: duckdb.DuckDBPyConnection) -> tuple[dict[str, np.ndarray], dict[str, tuple[int, int]]]:
        docs = con.sql("SELECT source, doc_id, n_tokens FROM documents").fetchnumpy()
        per = "SELECT source, count(*), sum(n_tokens)::BIGINT FROM documents GROUP BY 1"
        return docs, {s: (d, t) for s, d, t in con.sql(per).fetchall()}

    docs_df, indexed = _query(layout, read)
    n_docs_total = split_total = 0
    per_source = {}
    for k, name in enumerate(m.sources):
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
        recorded = m.per_source[name]
        per_source[name] = SourceReport(
            tokens_planned=recorded.tokens_planned,
            tokens_dropped=recorded.tokens_dropped,
            documents_dropped=recorded.documents_dropped,
            documents_indexed=indexed.get(name, (0, 0))[0],
            tokens_indexed=indexed.get(name, (0, 0))[1],
            tokens_packed=int(mine[:, 3].sum()),
            documents_packed=packed_docs,
            truncated_docs=len(split),
            mean_doc_tokens=float(mine[:, 3].mean()) if len(mine) else 0.0,
        )
    n = len(shards)
    cost = shards.seq_cost
    mean_cost = float(cost.mean()) if n else 0.0
    counts = np.diff(offs)
    return BuildReport(
        mix=m.mix,
        format_version=m.format_version,
        dtype=m.dtype,
        shards=len(m.shards),
        sequences=n,
        steps=m.steps,
        seq_len=seq_len,
        global_batch=m.global_batch,
        tokens=tokens,
        packing_efficiency=tokens / (n * seq_len) if n else 0.0,
        truncated_docs=split_total / n_docs_total if n_docs_total else 0.0,
        tokens_dropped=sum(s.tokens_dropped for s in per_source.values()),
        sequence_cost=SequenceCost(
            mean=mean_cost,
            max_over_mean=float(cost.max() / mean_cost) if mean_cost else 0.0,
            p95_over_mean=float(np.percentile(cost, 95) / mean_cost) if mean_cost else 0.0,
            cv=float(cost.std() / mean_cost) if mean_cost else 0.0,
        ),
        segments_per_sequence=SegmentsPerSequence(
            mean=float(counts.mean()) if n else 0.0, max=int(counts.max()) if n else 0
        ),
        per_source=per_source,
        mixture_error=build_mixture_error(layout, shards).report(),
        phases=m.phases,
        corrupt_files=tuple(problems),
        file_problems=problems,
        manifest_sealed=shards.sealed,
        lineage=m.lineage,
    )


def _report_digest(manifest_sha256: str, report: dict[str, Any]) -> str:
    text = json.dumps({"manifest_sha256": manifest_sha256, "report": report}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _sealed(layout: BuildLayout) -> str | None:
    """The ``manifest_sha256`` of the build's manifest (None when it has none)."""
    name = f"shards/{MANIFEST}"
    return parse_manifest(layout.store().read(name), f"{layout.url}/{name}")[0].manifest_sha256


def write_report(root: Path | BuildLayout, report: BuildReport) -> None:
    """Save :func:`inspect_build`'s ``report`` of the build in ``root`` as ``root/report.json``.

    Tied to the manifest it describes (its ``manifest_sha256``) and checksummed, so :func:`saved_report`
    never returns figures of other shards or an edited file.
    """
    layout = BuildLayout.of(root)
    sealed, body = _sealed(layout) or "", report.as_json()
    write_json_atomic(
        layout.root / REPORT,
        {"manifest_sha256": sealed, "report": body, "report_sha256": _report_digest(sealed, body)},
    )


def saved_report(root: Path | BuildLayout) -> BuildReport | None:
    """The report :func:`write_report` saved for the build in ``root``, or None when it is absent, damaged,
    or not about the shards there now (then run :func:`inspect_build`). Hashes no shard file."""
    layout = BuildLayout.of(root)
    try:
        saved = json.loads((layout.root / REPORT).read_text())
        sealed = _sealed(layout)
        body = saved["report"]
        ok = sealed and saved["manifest_sha256"] == sealed and saved["report_sha256"] == _report_digest(sealed, body)
        return BuildReport.model_validate(body) if ok else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ShardError, ValidationError):
        return None
