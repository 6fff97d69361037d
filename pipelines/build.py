"""Materialize a mix's assets in-process, stage by stage in the order of :data:`mixing.stages.STAGES` (what
``weir build`` runs inside its transaction, :mod:`pipelines.transaction`), and show it on a console: the
stages' warnings as lines, tokenization as progress bars.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from assets import WeirEngine, mix_assets
from mixing import Mix, stages
from mixing.engine import Engine, LocalEngine
from pipelines.resources import engine_resource, mix_storage_options, storage_resource

__all__ = ["build_mix", "progress_display", "step_line", "warnings_to"]


def build_mix(
    mix: Mix,
    out: Path | str,
    say: Callable[[str], None] = print,
    instance: dg.DagsterInstance | None = None,
    engine: WeirEngine | None = None,
) -> None:
    """Build ``mix`` into ``out`` (a local folder, or an fsspec URL: see :class:`assets.WeirStorage`) by
    materializing its assets and checks, stage by stage in the order of :data:`mixing.stages.STAGES`, a
    per-source stage once per source (sorted). ``engine`` runs the stages' fan-out work (default: the
    ``local`` engine, in this process). On a cluster engine, a stage with work to start ahead
    (:meth:`mixing.stages.Stage.run_ahead`: every source's chunks) submits all of it before its first run,
    so the cluster tokenizes the sources side by side while their runs collect it one after another. (Not
    several sources' runs at once from threads: Dagster configures logging per run, and two runs configuring
    it at once in one process deadlock.)

    Materializations are recorded in ``instance`` (default: a throwaway one; pass the UI's to see the build
    there). A stage that fails raises its own error (a ``PlanError``, a ``ShardError``, ...), which the CLI reports.
    Dagster's own console log is silenced; the stages' warnings (logger ``weir``: damaged chunks tokenized
    again, records lacking a template field, chat markers the tokenizer lacks) go to ``say`` as
    ``warning: ...`` lines.
    """
    defs = mix_assets(mix)
    engine = engine or engine_resource(kind="local")
    resources = {"storage": storage_resource(out, per_mix=False), "engine": engine}
    instance = instance or dg.DagsterInstance.ephemeral()
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}
    runner = engine.engine()

    with warnings_to(say), _forgetting(runner):
        for stage in stages.STAGES:
            if stage.ahead and not isinstance(runner, LocalEngine):
                layout = storage_resource(out, per_mix=False, bound=False).layout(mix)
                n = stage.run_ahead(mix, layout, mix_storage_options(mix), runner)
                say(f"  {stage.name}: {n} tasks of every source started on {runner.name}")
            for partition in stage.partitions(mix):
                say(step_line(stage.name, partition))
                dg.materialize(
                    defs,
                    selection=[dg.AssetKey([mix.name, stage.name])],
                    partition_key=partition,
                    resources=resources,
                    instance=instance,
                    run_config=quiet,
                )


@contextmanager
def _forgetting(engine: Engine) -> Iterator[None]:
    """Drop what ``engine`` still holds of work submitted ahead when the build ends (a failed run leaves some)."""
    try:
        yield
    finally:
        engine.forget()


def step_line(stage: str, partition: str | None) -> str:
    """The line a build prints as it starts one run of a stage: ``  documents [qa]``, ``  plan``."""
    return f"  {stage}" + (f" [{partition}]" if partition else "")


@contextmanager
def warnings_to(say: Callable[[str], None]) -> Iterator[None]:
    """Pass warnings logged under ``weir`` to ``say`` while the block runs."""

    class Say(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            say(f"  warning: {record.getMessage()}")

    log, handler = logging.getLogger("weir"), Say(logging.WARNING)
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)


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
        detail = f"{ev.documents:,} docs, {ev.chunks_done}/{ev.chunks} chunks, {ev.mb:.1f} MB, {ev.mb_per_s:.1f} MB/s"
        self.bar.update(self.tasks[ev.source], completed=ev.files_done, detail=detail)


@contextmanager
def progress_display(console: Console) -> Iterator[None]:
    """Show tokenization progress (files, documents, chunks, MB/s per source; over every worker of a cluster
    engine) as rich progress bars."""
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
