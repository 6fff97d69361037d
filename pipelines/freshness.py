"""Whether a build folder's documents are what a mix would tokenize now (before ``weir plan`` trusts them),
and bringing them up to date (``weir plan --compute``).

A folder's documents fit a mix when it holds documents of exactly the mix's sources, was tokenized with the
mix's tokenizer, lists the same files with the same contents, and holds the chunk of every file as the mix
renders it now (:func:`mixing.ingest.chunks.chunk_keys` hashes files, tokenizer and rendering). Each
difference is named in one line, so an old build never plans a mix it was not made from.

Files are compared by name (their path below the source's fixed folder), so a mix moved or copied elsewhere
with its data, or reaching it through a link, still fits the folder it built: a file at another path, or
with another fingerprint (a copy's new mtime), is the same file when its bytes are
(:func:`mixing.ingest.sources.file_digest` against the digest its chunk recorded), and a chunk under another
key is there when its content key is (:func:`mixing.ingest.chunks.content_key`), as a build would relocate
it. Only such files are read (hashed); an unmoved, unchanged folder is judged from listings alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from contract.store import Store, sha256_file
from mixing import Mix
from mixing.ingest.chunk_store import chunk_reports
from mixing.ingest.chunks import chunk_groups, content_key, describe_files
from mixing.ingest.sources import SourceIndexError, file_digest, file_name, index_source
from mixing.ingest.tokenizer import TextTokenizer, TokenizerError, load_tokenizer
from mixing.mixfile import envvars
from mixing.mixfile.mix import SourceSpec
from mixing.output.layout import BuildLayout
from mixing.stages import stages_until
from pipelines.display import step_line
from pipelines.kept_work import reuse_previous, work_cache

__all__ = ["compute_stats", "differences", "has_documents", "stats_folders"]


def has_documents(root: Path) -> bool:
    """Whether ``root`` holds a DuckDB file with a ``documents`` table (the stages up to ``length_stats`` ran)."""
    db = BuildLayout(root).duckdb
    if not db.exists():
        return False
    with duckdb.connect(str(db), read_only=True) as con:
        return bool(con.sql("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'documents'").fetchall()[0][0])


def stats_folders(mix: Mix, root: Path, storage_options: dict[str, Any] | None = None) -> dict[Path, list[str]]:
    """``root`` and its work cache (:func:`pipelines.kept_work.work_cache`), those holding documents, each with
    :func:`differences` (empty: it fits ``mix``), in that order."""
    return {f: differences(mix, f, storage_options) for f in (root, work_cache(root)) if has_documents(f)}


def compute_stats(mix: Mix, root: Path, storage_options: dict[str, Any] | None, say: Callable[[str], None]) -> Path:
    """Run the stages up to ``length_stats`` (:data:`mixing.stages.STAGES`) for ``mix``; return the folder
    they went to.

    Into ``root`` when it holds no finished build (no shards manifest), else into its work cache, seeded
    with ``root``'s chunks (only files whose chunks are missing are tokenized), so a finished build is
    never changed. Holds ``root``'s build lock meanwhile: raises :class:`pipelines.transaction.BuildBusy`
    when a build is writing there, and what the stages raise.
    """
    from pipelines.output_lock import output_lock  # Dagster (its run records) only when tokenizing

    finished = BuildLayout(root).manifest.exists()
    target = work_cache(root) if finished else root
    say(f"computing the length statistics of mix {mix.name!r} in {target}")
    with output_lock(root, False, say):
        if finished:
            reuse_previous(root, target)
        layout = BuildLayout(target)
        for stage in stages_until("length_stats"):
            for partition in stage.partitions(mix):
                say(step_line(stage.name, partition))
                stage.run(mix, layout, partition, storage_options)
    return target


def differences(mix: Mix, root: Path, storage_options: dict[str, Any] | None = None) -> list[str]:
    """What differs between ``mix`` now and the documents in the build folder ``root`` (empty: they fit).

    Lists each source's files again (no file is read). ``root`` must hold a ``documents`` table.
    """
    layout = BuildLayout(root)
    with duckdb.connect(str(layout.duckdb), read_only=True) as con:
        built = {s for (s,) in con.sql("SELECT DISTINCT source FROM documents").fetchall()}
    found: list[str] = []
    want = set(mix.sources)
    if built != want:
        found.append(
            f"sources: the mix has {sorted(want)}, {root} holds documents of {sorted(built)}"
            + (f" (not {sorted(built - want)})" if built - want else "")
        )
    spec = layout.tokenizer_dir / "spec.json"
    had = json.loads(spec.read_text()) if spec.is_file() else None
    tok_diff = _tok_diff(mix, had, layout.tokenizer_dir, root)
    same_tokenizer = tok_diff is None
    if tok_diff is not None:
        found.append(f"tokenizer: {tok_diff}")
    for name in sorted(want & built):
        try:
            now = _index(mix, name, storage_options)
        except SourceIndexError as e:
            found.append(f"files: {e}")
            continue
        then = pl.read_parquet(layout.source_dir(name) / "index.parquet")
        chunks = layout.source_dir(name) / "chunks"
        content = _Contents(chunks, _by_name(then))
        a, b = _by_name(now), content.then
        added, removed = sorted(a.keys() - b.keys()), sorted(b.keys() - a.keys())
        changed = sorted(n for n in a.keys() & b.keys() if content.changed(a[n]))
        if added or removed or changed:
            first = a[added[0]] if added else b[removed[0]] if removed else a[changed[0]]
            found.append(
                f"files: source {name!r} matches {len(a)} files now, {root} tokenized {len(b)}: {len(added)} new, "
                f"{len(removed)} gone, {len(changed)} changed (e.g. {first['path']})"
            )
        elif same_tokenizer:
            try:
                tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
            except TokenizerError as e:
                found.append(f"tokenizer: {root}/tokenizer: {e}")
                continue
            rendering = mix.sources[name]
            groups = chunk_groups(now, tok, rendering)
            missing = [g for g, k in groups if not (chunks / k / "report.json").is_file()]
            if missing and not all(content.there(g, tok, rendering) for g in missing):
                found.append(f"rendering: source {name!r} makes other documents now (format, field, template, ...)")
    return found


def _by_name(index: pl.DataFrame) -> dict[str, dict[str, Any]]:
    """The rows of an index that are read (not skipped) by file name (:func:`file_name`)."""
    if "skipped" in index.columns:
        index = index.filter(pl.col("skipped").is_null())
    return {file_name(row): row for row in index.iter_rows(named=True)}


class _Contents:
    """What one source's chunks in a folder recorded of their files' contents, read once, when first needed.

    ``then``: the folder's index rows by name. A file now at the path and with the fingerprint it had then is the
    same file (what the chunk keys trust too); any other is compared by its bytes.
    """

    def __init__(self, chunks: Path, then: dict[str, dict[str, Any]]) -> None:
        self.chunks = chunks
        self.then = then
        self._reports: dict[str, dict[str, Any]] | None = None
        self._recorded_by_path: dict[str, str | None] | None = None
        self._hashed: dict[str, str | None] = {}

    def reports(self) -> dict[str, dict[str, Any]]:
        """The sound reports of the chunks in the folder, by key."""
        if self._reports is None:
            keys = [p.name for p in self.chunks.iterdir() if p.is_dir()] if self.chunks.is_dir() else []
            self._reports = chunk_reports(Store(self.chunks), keys)
        return self._reports

    def _recorded(self) -> dict[str, str | None]:
        """Each tokenized file's digest by the path it had then."""
        if self._recorded_by_path is None:
            reports = self.reports().values()
            self._recorded_by_path = {f["path"]: f["digest"] for rep in reports for f in rep.get("files") or []}
        return self._recorded_by_path

    def _unmoved(self, row: dict[str, Any]) -> bool:
        was = self.then.get(file_name(row))
        return was is not None and (was["path"], was["fingerprint"]) == (row["path"], row["fingerprint"])

    def digest(self, row: dict[str, Any]) -> str | None:
        """``row``'s content digest: the one recorded for it when it is unmoved, else its bytes hashed (once)."""
        if self._unmoved(row) and (known := self._recorded().get(row["path"])):
            return known
        if row["path"] not in self._hashed:
            self._hashed[row["path"]] = file_digest(row)
        return self._hashed[row["path"]]

    def changed(self, row: dict[str, Any]) -> bool:
        """Whether the file of ``row`` (now) holds other bytes than the file of its name did then."""
        if self._unmoved(row):
            return False
        was = self._recorded().get(self.then[file_name(row)]["path"])
        return was is None or self.digest(row) != was

    def there(self, group: list[dict[str, Any]], tok: TextTokenizer, spec: SourceSpec) -> bool:
        """Whether the documents of chunk ``group`` are in the folder under another key (its files moved)."""
        for row in group:
            row["digest"] = self.digest(row)
        want = content_key(describe_files(group), tok, spec)
        return want is not None and any(rep.get("content") == want for rep in self.reports().values())


def _index(mix: Mix, name: str, storage_options: dict[str, Any] | None) -> pl.DataFrame:
    """The source's index as :func:`mixing.stages.index` writes it (``{env_NAME}`` values in their shown form)."""
    df = index_source(mix, name, storage_options)
    for value, placeholder in envvars.replacements():
        df = df.with_columns(pl.col(pl.String).str.replace_all(value, placeholder, literal=True))
    return df


def _tok_diff(mix: Mix, had: dict[str, Any] | None, prepared: Path, root: Path) -> str | None:
    """What differs between the mix's tokenizer and the one ``root`` prepared (its ``spec.json`` ``had`` and its
    copy of the file in ``prepared``), or None. An ``hf`` tokenizer's file is compared by content, not by the
    path that names it: another file at the same path differs, the same file named another way does not."""
    if had is None:
        return f"{root} has no prepared tokenizer"
    want = mix.tokenizer.model_dump(mode="json")
    by_content = mix.tokenizer.kind == "hf" and had.get("kind") == "hf"
    keys = sorted(k for k in want.keys() | had.keys() if want.get(k) != had.get(k) and not (by_content and k == "path"))
    found = [f"{k} is {want.get(k)!r} in the mix, {had.get(k)!r} in {root}" for k in keys]
    if by_content and not keys:
        try:
            same = sha256_file(Path(mix.tokenizer_path() or "")) == sha256_file(prepared / "tokenizer.json")
        except OSError as e:
            return f"path: cannot compare {mix.tokenizer.path!r} with {root}'s copy ({envvars.redact(str(e))})"
        if not same:
            found.append(f"path: {mix.tokenizer.path!r} holds another tokenizer than the one {root} was tokenized with")
    return "; ".join(found) or None
