"""What a build shows on a console as it runs: one line as each stage's run starts (:func:`step_line`), the
stages' warnings as ``warning:`` lines (:func:`warnings_to`), and tokenization progress as rich progress bars
(:func:`progress_display`).

Both context managers add a handler to a logger for the block only and leave the logger as it was (handlers and
level) however the block ends. Nothing here imports dagster: the commands that only plan or compute statistics
show their progress with it too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

__all__ = ["progress_display", "step_line", "warnings_to"]


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
