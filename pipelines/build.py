"""Materialize a mix's assets in-process, stage by stage (what ``weir build`` runs), reusing a previous build.

``reuse_previous`` seeds a fresh staging folder with the previous output's tokenized chunks and trained
tokenizer (hard links; those files are only ever replaced, never written in place), so that an
incremental rebuild re-tokenizes only chunks whose files changed, while the staging folder still
replaces the output only when the whole build succeeded.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from assets import mix_assets
from mixing import Mix
from pipelines.resources import storage_resource

__all__ = ["build_mix", "progress_display", "reuse_previous"]


def build_mix(
    mix: Mix, out: Path, say: Callable[[str], None] = print, instance: dg.DagsterInstance | None = None
) -> None:
    """Build ``mix`` into ``out`` by materializing its assets and checks: each source partition, then the rest.

    Materializations are recorded in ``instance`` (default: a throwaway one; pass the UI's to see the build
    there). Raises ``dagster.DagsterExecutionStepExecutionError`` (wrapping the stage's own error) on failure.
    """
    defs = mix_assets(mix)
    resources = {"storage": storage_resource(out, per_mix=False)}
    instance = instance or dg.DagsterInstance.ephemeral()
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}

    def run(stage: str, partition: str | None = None) -> None:
        say(f"  {stage}" + (f" [{partition}]" if partition else ""))
        dg.materialize(
            defs,
            selection=[dg.AssetKey([mix.name, stage])],
            partition_key=partition,
            resources=resources,
            instance=instance,
            run_config=quiet,
        )

    for stage in ("source_index", "tokenizer", "documents", "length_stats", "plan", "packed_shards"):
        if stage in ("source_index", "documents"):
            for name in sorted(mix.sources):
                run(stage, name)
        else:
            run(stage)


def reuse_previous(previous: Path, stage: Path) -> int:
    """Hard-link (or copy) ``previous``'s reusable work into the empty build folder ``stage``.

    Reusable: ``sources/*/chunks/`` (tokenized chunks, keyed by file, tokenizer and spec fingerprints)
    and ``tokenizer/`` (kept only if its training sample is unchanged). Returns the files linked.
    """
    n = 0
    parts = [previous / "tokenizer", *sorted((previous / "sources").glob("*/chunks"))]
    for src in parts:
        if not src.is_dir():
            continue

        def link(a: str, b: str) -> None:
            nonlocal n
            n += 1
            try:
                os.link(a, b)
            except OSError:  # another file system: copy instead
                shutil.copy2(a, b)

        shutil.copytree(src, stage / src.relative_to(previous), copy_function=link, dirs_exist_ok=True)
    return n


class _ProgressHandler(logging.Handler):
    def __init__(self, bar: Progress) -> None:
        super().__init__(logging.INFO)
        self.bar = bar
        self.tasks: dict[str, TaskID] = {}

    def emit(self, record: logging.LogRecord) -> None:
        ev = getattr(record, "progress", None)
        if ev is None:
            return
        if ev.source not in self.tasks:
            self.tasks[ev.source] = self.bar.add_task(ev.source, total=ev.files, detail="")
        detail = f"{ev.documents:,} docs, {ev.mb:.1f} MB, {ev.mb_per_s:.1f} MB/s"
        self.bar.update(self.tasks[ev.source], completed=ev.files_done, detail=detail)


@contextmanager
def progress_display(console: Console) -> Iterator[None]:
    """Show tokenization progress (files, documents, MB/s per source) as rich progress bars."""
    bar = Progress(
        TextColumn("  tokenize {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("files · {task.fields[detail]}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )
    handler = _ProgressHandler(bar)
    log = logging.getLogger("weir.progress")
    log.addHandler(handler)
    old_level = log.level
    log.setLevel(logging.INFO)
    try:
        with bar:
            yield
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
