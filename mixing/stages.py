"""The stages of a build: one function each, reading the previous stages' outputs from a build folder,
and :data:`STAGES`, the one table of their names, partitioning and dependencies (rows: :class:`mixing.stage.Stage`).

Each function writes its small files under ``layout.root`` (atomically, file by file), has the engine's
workers write the large ones (token chunks, shards) straight to the build root, publishes what it made to
the build root (``layout.url``; nothing to copy when that is ``layout.root`` itself) and ends with the
stage's commit record there (:mod:`mixing.output.commit`), which it removed before writing anything
(:func:`mixing.stage.begin`, :func:`mixing.stage.publish`). It returns a small summary for metadata.

:data:`STAGES` is what everything that runs or shows stages iterates: the Dagster asset factory (asset
keys, partitions, deps), ``weir build`` (the order it materializes them in) and ``weir plan --compute``
(the stages up to ``length_stats``). Order: ``source_index`` (per source) → ``tokenizer`` →
``documents`` (per source) → ``length_stats`` → ``plan`` → ``packed_shards``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import polars as pl

from contract.atomic import atomic_path
from contract.manifest import MANIFEST, Manifest
from contract.store import Store
from mixing.continuation import Base, documents_digest
from mixing.engine import LOCAL, Engine, LocalEngine
from mixing.ingest.documents import TokenizeReport, tokenize_source
from mixing.ingest.documents import tokenize_ahead as tokenize_source_ahead
from mixing.ingest.sources import SourceIndexError, index_source
from mixing.ingest.tokenizer import TextTokenizer, load_tokenizer
from mixing.ingest.tokenizer import prepare_tokenizer as _prepare
from mixing.mixfile import envvars
from mixing.mixfile.mix import Mix
from mixing.output.layout import BuildLayout
from mixing.pack.packed import write_packed
from mixing.pack.packing import stream_plan
from mixing.pack.whole_drops import whole_drops
from mixing.plan.audit import PlanAudit, audit_plan
from mixing.plan.curriculum_plan import Past, Plan, make_plan
from mixing.plan.database import duckdb_config
from mixing.plan.quotas import step_quotas
from mixing.plan.stats import LengthStats, compute_length_stats
from mixing.stage import Stage, StorageOptions, begin, publish
from mixing.tokenizer_sample import tokenizer_sample

__all__ = [
    "PLAN_LOG",
    "STAGES",
    "fingerprints",
    "index",
    "length_stats",
    "pack",
    "plan",
    "plan_audit",
    "prepare_tokenizer",
    "stages_until",
    "tokenize",
    "tokenize_ahead",
]

PLAN_LOG = logging.getLogger("weir.plan")  # the plan's warnings: `weir build` prints what logs under `weir`
Progress = Callable[[str], None]


def index(mix: Mix, layout: BuildLayout, source: str, storage_options: StorageOptions = None) -> pl.DataFrame:
    """List and fingerprint the files of ``source``; write ``sources/<source>/index.parquet``.

    Paths (and every other text) are in their shown form: ``{env_NAME}`` values hidden (:mod:`mixing.mixfile.envvars`).
    """
    begin(layout, "source_index", source)
    try:
        df = index_source(mix, source, storage_options)
    except SourceIndexError as e:
        raise SourceIndexError(envvars.redact(str(e))) from None
    for value, placeholder in envvars.replacements():
        df = df.with_columns(pl.col(pl.String).str.replace_all(value, placeholder, literal=True))
    with atomic_path(layout.source_dir(source) / "index.parquet") as tmp:
        df.write_parquet(tmp)
    publish(layout, "source_index", source, [f"sources/{source}/index.parquet"])
    return df


def prepare_tokenizer(mix: Mix, layout: BuildLayout, storage_options: StorageOptions = None) -> TextTokenizer:
    """Train (``bpe``) or copy the mix's tokenizer into ``tokenizer/``; needs every source indexed. A
    continuation takes its base's tokenizer as it is (a new source would change a trained one's sample)."""
    begin(layout, "tokenizer")
    if mix.continues is not None:
        Base(mix.continues.base, mix.continues.at, storage_options).copy_tokenizer(layout.tokenizer_dir)
        tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    else:
        tok = _prepare(mix.tokenizer, layout.tokenizer_dir, tokenizer_sample(mix, layout, storage_options))
    names = sorted(p.name for p in layout.tokenizer_dir.iterdir() if not p.name.startswith("."))
    publish(layout, "tokenizer", None, [f"tokenizer/{n}" for n in names])
    return tok


def tokenize(
    mix: Mix,
    layout: BuildLayout,
    source: str,
    progress: Progress = lambda _m: None,
    storage_options: StorageOptions = None,
    engine: Engine = LOCAL,
) -> TokenizeReport:
    """Tokenize every indexed file of ``source`` on ``engine`` into chunks in the build root's
    ``sources/<source>/chunks/`` (reusing unchanged ones), and index them in ``sources/<source>/``.

    Raises :class:`mixing.ingest.documents.DocumentsError` when records were read but none was kept."""
    begin(layout, "documents", source)
    tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    files = pl.read_parquet(layout.source_dir(source) / "index.parquet")
    report = tokenize_source(
        source,
        mix.sources[source],
        files,
        tok,
        layout.source_dir(source),
        progress,
        storage_options,
        require_documents=True,  # a source none of whose records is kept fails here, saying why
        chunks=_chunks(layout, source),
        engine=engine,
    )
    chunks = [{**r, "name": f"sources/{source}/chunks/{r['name']}"} for r in report.chunk_records]
    publish(
        layout, "documents", source, [f"sources/{source}/{n}" for n in ("docs.parquet", "quarantine.jsonl")], chunks
    )
    return report


def tokenize_ahead(
    mix: Mix, layout: BuildLayout, storage_options: StorageOptions = None, engine: Engine = LOCAL
) -> int:
    """Start every source's tokenizing (and the checks of its reused chunks) on ``engine`` at once, for the
    :func:`tokenize` runs that follow to collect: on a cluster the sources are tokenized side by side. Sources
    whose chunks are largest go first (each source's chunks largest first), so the cluster ends on small
    ones. Needs every source indexed and the tokenizer prepared. Returns the tasks started (0 on the local
    engine)."""
    if isinstance(engine, LocalEngine):
        return 0
    tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    work = [
        tokenize_source_ahead(
            mix.sources[source],
            pl.read_parquet(layout.source_dir(source) / "index.parquet"),
            tok,
            _chunks(layout, source),
            storage_options,
            engine,
        )
        for source in sorted(mix.sources)
    ]
    return sum(w.submit(engine) for w in sorted(work, key=lambda w: -w.largest))


def _chunks(layout: BuildLayout, source: str) -> Store:
    return layout.store().sub(f"sources/{source}/chunks")


def length_stats(mix: Mix, layout: BuildLayout) -> LengthStats:
    """Length tables in ``weir.duckdb`` over every source's documents (DuckDB bounded by
    :func:`~mixing.plan.database.duckdb_config`, as in :func:`plan`)."""
    begin(layout, "length_stats")
    files = {name: layout.source_dir(name) / "docs.parquet" for name in mix.sources}
    stats = compute_length_stats(layout.duckdb, files, mix.sequence.length, duckdb_config())
    with atomic_path(layout.plan_dir / "length_histogram.parquet") as tmp:
        stats.histogram.write_parquet(tmp)
    with atomic_path(layout.plan_dir / "length_summary.parquet") as tmp:
        stats.summary.write_parquet(tmp)
    publish(layout, "length_stats", None, [f"plan/length_{n}.parquet" for n in ("histogram", "summary")])
    return stats


def plan(mix: Mix, layout: BuildLayout, storage_options: StorageOptions = None) -> Plan:
    """Per-step quotas and document draws in ``weir.duckdb`` (and ``plan/{quotas,phases,sources}.parquet``),
    fitted to their packing (:mod:`mixing.plan.fit`, probed by :func:`mixing.pack.whole_drops.whole_drops`: no
    phase end drops a document whole).

    Each of the plan's warnings (:func:`mixing.plan.feasibility.plan_warnings`, the sentences ``weir plan``
    prints) is logged on :data:`PLAN_LOG`, so ``weir build`` prints the same words. A continuation
    (``mix.continues``) is checked against its base first (:class:`mixing.continuation.Base`, read with
    ``storage_options``) and planned from its switch step on."""
    begin(layout, "plan")
    past, order = None, None
    if mix.continues is not None:
        base = Base(mix.continues.base, mix.continues.at, storage_options)
        past, order = _past(mix, layout, base), _source_order(mix, base)
    result = make_plan(mix, layout.duckdb, duckdb_config(), past, probe=whole_drops(mix, order))
    for warning in result.warnings:
        PLAN_LOG.warning(warning)
    with atomic_path(layout.plan_dir / "quotas.parquet") as tmp:
        result.quotas.write_parquet(tmp)
    with atomic_path(layout.plan_dir / "phases.parquet") as tmp:
        result.phases.write_parquet(tmp)
    with atomic_path(layout.plan_dir / "sources.parquet") as tmp:
        result.per_source.write_parquet(tmp)
    publish(layout, "plan", None, [f"plan/{n}.parquet" for n in ("quotas", "phases", "sources")])
    return result


def _past(mix: Mix, layout: BuildLayout, base: Base) -> Past:
    """The continuation's past, after checking that ``mix`` leaves its ``base``'s steps before the switch alone."""
    docs = {s: documents_digest(pl.read_parquet(layout.source_dir(s) / "docs.parquet")) for s in mix.sources}
    tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    base.check(mix, step_quotas(mix), docs, tok.fingerprint)
    seq = mix.sequence.length
    used = base.used(seq)
    return Past(
        at=base.at,
        trained={s: partial(u.times, seq_len=seq) for s, u in used.items()},
        tokens={s: u.tokens for s, u in used.items()},
        quotas=base.quotas,
    )


def plan_audit(mix: Mix, layout: BuildLayout) -> PlanAudit:
    """The plan's checks: ``mixture_error``, planned units exist, none twice per epoch, budget per phase."""
    return audit_plan(layout.duckdb, mix.sequence.length)


def pack(
    mix: Mix,
    layout: BuildLayout,
    on_shard: Callable[[int], None] = lambda _k: None,
    engine: Engine = LOCAL,
    storage_options: StorageOptions = None,
) -> Manifest:
    """Pack the plan and have ``engine`` write the build root's ``shards/``, then write the manifest (last);
    return the manifest.

    ``on_shard(k)`` runs as each shard is written (progress reporting; ``k`` counts them). A continuation's
    shards start with its base's of the steps before the switch (read with ``storage_options``), its sources
    in the base's order, then those new in this mix.
    """
    begin(layout, "packed_shards")
    tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    db = duckdb_config()  # DuckDB's pages read by the packer, bounded as in length_stats and plan
    cost = mix.balance.cost.model()
    base, order = None, None
    if mix.continues is not None:
        base = Base(mix.continues.base, mix.continues.at, storage_options)
        order = _source_order(mix, base)
    stream = stream_plan(
        layout.duckdb, mix.sequence.length, mix.sequence.global_batch, cost=cost, config=db, sources=order
    )
    pad, eos = tok.pad_id, tok.eos_id
    manifest = write_packed(
        mix,
        layout,
        stream,
        tok.fingerprint,
        tok.vocab_size,
        pad,
        eos_id=eos,
        on_shard=on_shard,
        engine=engine,
        db_config=db,
        base=base,
    )
    name = f"shards/{MANIFEST}"
    got = layout.store().digest(name)
    assert got is not None, "write_packed wrote the manifest"
    publish(layout, "packed_shards", None, [], [{"name": name, "bytes": got[0], "sha256": got[1]}])
    return manifest


def _source_order(mix: Mix, base: Base) -> tuple[str, ...]:
    """A continuation's source indices: its base's sources in their order, then those new in ``mix``."""
    old = tuple(base.manifest.sources or ())
    return old + tuple(sorted(set(mix.sources) - set(old)))


def fingerprints(mix: Mix, layout: BuildLayout) -> dict[str, str]:
    """``mix_fingerprint`` and ``tokenizer_fingerprint`` (sha256 hex) of a build whose tokenizer is prepared.

    The same values the shards' manifest records, for metadata of the stages before it.
    """
    tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    return {"mix_fingerprint": mix.fingerprint(), "tokenizer_fingerprint": tok.fingerprint}


STAGES: tuple[Stage, ...] = (
    Stage("source_index", per_source=True, deps=(), fn=index, reads_sources=True),
    Stage("tokenizer", per_source=False, deps=("source_index",), fn=prepare_tokenizer, reads_sources=True),
    Stage(
        "documents",
        per_source=True,
        deps=("source_index", "tokenizer"),
        fn=tokenize,
        reads_sources=True,
        fans_out=True,
        ahead=tokenize_ahead,
    ),
    Stage("length_stats", per_source=False, deps=("documents",), fn=length_stats),
    # plan and packed_shards read a continuation's base, which may be in an object store
    Stage("plan", per_source=False, deps=("length_stats",), fn=plan, reads_sources=True),
    Stage("packed_shards", per_source=False, deps=("plan",), fn=pack, fans_out=True, reads_sources=True),
)
"""Every stage, in an order that runs each after its ``deps``."""


def stages_until(last: str) -> tuple[Stage, ...]:
    """The stages of :data:`STAGES` up to and including the one named ``last`` (``KeyError`` if none is)."""
    names = [s.name for s in STAGES]
    if last not in names:
        raise KeyError(f"no stage {last!r}; stages: {names}")
    return STAGES[: names.index(last) + 1]
