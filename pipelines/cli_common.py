"""What the ``weir`` commands share: the two consoles, the exit statuses, reading a mix file and a build argument.

Every command prints through :data:`out` (stdout) and :data:`err` (stderr), so a log keeps whole lines; a mix file
that does not load or names paths that do not exist exits 2, a goal missed under ``--strict`` exits
:data:`STRICT_EXIT`. Nothing heavy is imported here: dagster and the build's libraries load with the commands.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.markup import escape

from mixing import MixError, load_mix

if TYPE_CHECKING:
    from mixing import Mix
    from mixing.output.layout import BuildLayout
    from mixing.report import BuildReport

__all__ = [
    "STRICT_EXIT",
    "build_root",
    "check_paths_or_exit",
    "err",
    "exit_if_missed",
    "load_mix_or_exit",
    "out",
    "print_notes",
    "say_error",
    "storage_options",
    "with_stream",
]


def _console(stderr: bool = False) -> Console:
    """A console; outside a terminal (a log file, CI) lines and tables are never cut or wrapped to fit
    80 (or $COLUMNS) columns: a log keeps every number whole."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 100_000)


out = _console()
err = _console(stderr=True)
STRICT_EXIT = 4  # --strict: the build is whole but a goal (packing, truncation, mixture_error) was missed


def say_error(label: str, what: object) -> None:
    """One line on stderr, ``label: what``, ``label`` in bold red; ``what`` (an error's message, which may quote a
    mix file's names, a log's rows or paths) printed as it is, never read as rich markup."""
    err.print(f"[bold red]{label}[/]: {escape(str(what))}", highlight=False, soft_wrap=True)


def load_mix_or_exit(mix_path: Path) -> Mix:
    """The mix file at ``mix_path``; an invalid one is printed as one error (file, line, field) and exits 2."""
    try:
        return load_mix(mix_path)
    except MixError as e:
        say_error("invalid mix file", e)
        raise typer.Exit(2) from None


def check_paths_or_exit(m: Mix, list_sources: bool) -> list[str]:
    """:func:`mixing.mixfile.paths.check_paths`: print each problem as an invalid mix file's error (after the
    notes, with ``list_sources``) and exit 2 if any; else return the notes. Sources are listed (``list_sources``)
    with the S3 options of the environment."""
    from mixing.mixfile.paths import check_paths

    found = check_paths(m, _s3_options(m) if list_sources else None, list_sources=list_sources)
    if found.problems:
        print_notes(found.notes if list_sources else [])
        for problem in found.problems:
            err.print(f"[bold red]invalid mix file[/]: {escape(problem)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    return found.notes


def print_notes(notes: list[str]) -> None:
    """Print each note of :func:`check_paths_or_exit` on stderr, one line each."""
    for note in notes:
        err.print(f"[yellow]note[/]: {escape(note)}", highlight=False, soft_wrap=True)


def _s3_options(m: Mix) -> dict[str, object] | None:
    """fsspec options from the ``AWS_*`` variables when a source is remote, else None."""
    try:
        for name in m.sources:
            m.source_uri(name)
    except MixError:  # a variable not set: check_paths names it
        return None
    if not any(k.startswith("AWS_") and v for k, v in os.environ.items()):
        return None  # nothing to list with
    return storage_options(m)


def storage_options(m: Mix) -> dict[str, object] | None:
    """:func:`pipelines.resources.mix_storage_options` for a mix reading remote files (Dagster imported only
    then), else None."""
    if all("://" not in u or u.startswith("file://") for u in (m.source_uri(n) for n in m.sources)):
        return None
    from pipelines.resources import mix_storage_options

    return mix_storage_options(m)


def exit_if_missed(missed: list[str], strict: bool, quiet: bool = False) -> None:
    """Name the missed goals on stderr (unless ``quiet``: --json keeps stderr for errors); exit 4 if ``strict``."""
    if missed and not quiet:
        err.print(f"[yellow]goal missed[/]: {'; '.join(missed)}", highlight=False, soft_wrap=True)
    if missed and strict:
        raise typer.Exit(STRICT_EXIT)


def build_root(build_dir: str) -> Path | BuildLayout:
    """A build argument as its root: a local folder (its ``shards/`` named or not), or for an ``s3://``/fsspec URL
    the layout read with the working folder of the machine that built it ($WEIR_WORK_DIR)."""
    from contract.store import is_local

    if not is_local(build_dir):  # Dagster's resources read the S3 settings: imported only for a URL (seconds)
        from assets.storage import work_folder
        from mixing.output.layout import BuildLayout
        from pipelines.resources import storage_resource

        url = build_dir.rstrip("/").removesuffix("/shards")
        options = storage_resource(url, per_mix=False, bound=False).storage_options()
        return BuildLayout(work_folder(url), target=url, storage_options=options)
    local = Path(build_dir)
    return local.parent if local.name == "shards" else local


def with_stream(report: BuildReport, root: Path | BuildLayout) -> BuildReport:
    """``report`` plus ``mixture_error_stream`` (:func:`assets.stream.stream_report`) when the mix file
    regroups steps (otherwise the trainer's stream is the build's steps)."""
    if _regroups(root):
        from assets.stream import stream_report

        return report.model_copy(update={"mixture_error_stream": stream_report(root)})
    return report


def _regroups(root: Path | BuildLayout) -> bool:
    """Whether the build's manifest regroups build steps into training steps (a regrouping window over 1)."""
    from mixing.output.layout import BuildLayout

    return BuildLayout.of(root).shard_set().manifest.regrouping.window > 1
