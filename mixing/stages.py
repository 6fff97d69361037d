"""The stages of a build: one function each, reading the previous stages' outputs from a build folder,
and :data:`STAGES`, the one table of their names, partitioning and dependencies.

Each function writes only under ``layout.root`` (atomically, file by file) and returns a small summary for
metadata. :data:`STAGES` is what everything that runs or shows stages iterates: the Dagster asset factory
(asset keys, partitions, deps), ``weir build`` (the order it materializes them in) and ``weir plan
--compute`` (the stages up to ``length_stats``). Order: ``source_index`` (per source) → ``tokenizer`` →
``documents`` (per source) → ``length_stats`` → ``plan`` → ``packed_shards``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import polars as pl

from mixing.format.layout import BuildLayout, atomic_path
from mixing.format.manifest import Manifest
from mixing.ingest.documents import TokenizeReport, tokenize_source
from mixing.ingest.sources import SourceIndexError, index_source, read_records
from mixing.ingest.tokenizer import TextTokenizer, load_tokenizer
from mixing.ingest.tokenizer import prepare_tokenizer as _prepare
from mixing.pack.packed import write_packed
from mixing.pack.packing import pack_plan
from mixing.plan.audit import PlanAudit, audit_plan
from mixing.plan.curriculum_plan import Plan, make_plan
from mixing.plan.stats import LengthStats, compute_length_stats
from mixing.spec import envvars
from mixing.spec.mixfile import Mix

__all__ = [
    "STAGES",
    "Stage",
    "fingerprints",
    "index",
    "length_stats",
    "pack",
    "plan",
    "plan_audit",
    "prepare_tokenizer",
    "stages_until",
    "tokenize",
]

Progress = Callable[[str], None]
StorageOptions = dict[str, Any] | None  # fsspec options (s3 endpoint, credentials) from the Dagster resource


def index(mix: Mix, layout: BuildLayout, source: str, storage_options: StorageOptions = None) -> pl.DataFrame:
    """List and fingerprint the files of ``source``; write ``sources/<source>/index.parquet``.

    Paths (and every other text) are in their shown form: ``{env_NAME}`` values hidden (:mod:`mixing.spec.envvars`).
    """
    try:
        df = index_source(mix, source, storage_options)
    except SourceIndexError as e:
        raise SourceIndexError(envvars.redact(str(e))) from None
    for value, placeholder in envvars.replacements():
        df = df.with_columns(pl.col(pl.String).str.replace_all(value, placeholder, literal=True))
    with atomic_path(layout.source_dir(source) / "index.parquet") as tmp:
        df.write_parquet(tmp)
    return df


def _files(layout: BuildLayout, source: str) -> list[str]:
    index = pl.read_parquet(layout.source_dir(source) / "index.parquet")
    if "skipped" in index.columns:  # paths the index skipped (dangling symlinks, ...) are never read
        index = index.filter(pl.col("skipped").is_null())
    return index["path"].to_list()


def _sample(mix: Mix, layout: BuildLayout, storage_options: StorageOptions = None) -> Iterator[str]:
    """Up to ``tokenizer.sample_bytes`` of text, an equal share per source, in index order.

    Deterministic: the same files (sorted) give the same sample, and a file past the point where its
    source's share is full is never read, so changing it leaves the trained tokenizer as it was.
    """
    share = mix.tokenizer.sample_bytes // len(mix.sources)
    for name in sorted(mix.sources):
        taken = 0
        for path in _files(layout, name):
            for rec in read_records(path, mix.sources[name], storage_options):
                if rec.text:
                    yield rec.text[: share - taken]
                    taken += min(len(rec.text), share - taken)
                if taken >= share:
                    break
            if taken >= share:
                break


def prepare_tokenizer(mix: Mix, layout: BuildLayout, storage_options: StorageOptions = None) -> TextTokenizer:
    """Train (``bpe``) or copy the mix's tokenizer into ``tokenizer/``; needs every source indexed."""
    return _prepare(mix.tokenizer, layout.tokenizer_dir, _sample(mix, layout, storage_options))


def tokenize(
    mix: Mix,
    layout: BuildLayout,
    source: str,
    progress: Progress = lambda _m: None,
    storage_options: StorageOptions = None,
) -> TokenizeReport:
    """Tokenize every indexed file of ``source`` into ``sources/<source>/`` (reusing unchanged chunks).

    Raises :class:`mixing.ingest.documents.DocumentsError` when records were read but none was kept."""
    tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    files = pl.read_parquet(layout.source_dir(source) / "index.parquet")
    return tokenize_source(
        source,
        mix.sources[source],
        files,
        tok,
        layout.source_dir(source),
        progress,
        storage_options,
        require_documents=True,  # a source none of whose records is kept fails here, saying why
    )


def length_stats(mix: Mix, layout: BuildLayout) -> LengthStats:
    """Length tables in ``weir.duckdb`` over every source's documents."""
    files = {name: layout.source_dir(name) / "docs.parquet" for name in mix.sources}
    stats = compute_length_stats(layout.duckdb, files, mix.sequence.length)
    with atomic_path(layout.plan_dir / "length_histogram.parquet") as tmp:
        stats.histogram.write_parquet(tmp)
    with atomic_path(layout.plan_dir / "length_summary.parquet") as tmp:
        stats.summary.write_parquet(tmp)
    return stats


def plan(mix: Mix, layout: BuildLayout) -> Plan:
    """Per-step quotas and document draws in ``weir.duckdb`` (and ``plan/{quotas,phases,sources}.parquet``)."""
    result = make_plan(mix, layout.duckdb)
    with atomic_path(layout.plan_dir / "quotas.parquet") as tmp:
        result.quotas.write_parquet(tmp)
    with atomic_path(layout.plan_dir / "phases.parquet") as tmp:
        result.phases.write_parquet(tmp)
    with atomic_path(layout.plan_dir / "sources.parquet") as tmp:
        result.per_source.write_parquet(tmp)
    return result


def plan_audit(mix: Mix, layout: BuildLayout) -> PlanAudit:
    """The plan's checks: ``mixture_error``, planned units exist, none twice per epoch, budget per phase."""
    return audit_plan(layout.duckdb, mix.sequence.length)


def pack(mix: Mix, layout: BuildLayout, on_shard: Callable[[int], None] = lambda _k: None) -> Manifest:
    """Pack the plan and write ``shards/`` with its manifest (last); return the manifest.

    ``on_shard(k)`` runs after shard ``k`` is written (progress reporting).
    """
    tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    packing = pack_plan(layout.duckdb, mix.sequence.length, mix.sequence.global_batch, cost=mix.balance.cost.model())
    pad, eos = tok.pad_id, tok.eos_id
    return write_packed(mix, layout, packing, tok.fingerprint, tok.vocab_size, pad, eos_id=eos, on_shard=on_shard)


def fingerprints(mix: Mix, layout: BuildLayout) -> dict[str, str]:
    """``mix_fingerprint`` and ``tokenizer_fingerprint`` (sha256 hex) of a build whose tokenizer is prepared.

    The same values the shards' manifest records, for metadata of the stages before it.
    """
    tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    return {"mix_fingerprint": mix.fingerprint(), "tokenizer_fingerprint": tok.fingerprint}


@dataclass(frozen=True)
class Stage:
    """One stage of a build: the asset ``[<mix name>, name]`` and the function that computes it.

    ``per_source``: partitioned by source name, run once per source (sorted); else once for the whole mix.
    ``deps``: the stages whose outputs it reads, all earlier in :data:`STAGES`. ``reads_sources``: it reads
    the sources' files, so ``fn`` takes the fsspec ``storage_options``.
    """

    name: str
    per_source: bool
    deps: tuple[str, ...]
    fn: Callable[..., object]
    reads_sources: bool = False

    def partitions(self, mix: Mix) -> list[str | None]:
        """The runs of this stage: each source name (sorted) if ``per_source``, else one run (``None``)."""
        return [*sorted(mix.sources)] if self.per_source else [None]

    def run(
        self, mix: Mix, layout: BuildLayout, source: str | None = None, storage_options: StorageOptions = None
    ) -> object:
        """Run ``fn`` for one partition (``source`` for a per-source stage, else ``None``); return its summary."""
        if (source is not None) != self.per_source:
            raise ValueError(f"stage {self.name!r} runs {'per source' if self.per_source else 'once'}: {source=}")
        args = (mix, layout, source) if self.per_source else (mix, layout)
        return self.fn(*args, **({"storage_options": storage_options} if self.reads_sources else {}))


STAGES: tuple[Stage, ...] = (
    Stage("source_index", per_source=True, deps=(), fn=index, reads_sources=True),
    Stage("tokenizer", per_source=False, deps=("source_index",), fn=prepare_tokenizer, reads_sources=True),
    Stage("documents", per_source=True, deps=("source_index", "tokenizer"), fn=tokenize, reads_sources=True),
    Stage("length_stats", per_source=False, deps=("documents",), fn=length_stats),
    Stage("plan", per_source=False, deps=("length_stats",), fn=plan),
    Stage("packed_shards", per_source=False, deps=("plan",), fn=pack),
)
"""Every stage, in an order that runs each after its ``deps``."""


def stages_until(last: str) -> tuple[Stage, ...]:
    """The stages of :data:`STAGES` up to and including the one named ``last`` (``KeyError`` if none is)."""
    names = [s.name for s in STAGES]
    if last not in names:
        raise KeyError(f"no stage {last!r}; stages: {names}")
    return STAGES[: names.index(last) + 1]
