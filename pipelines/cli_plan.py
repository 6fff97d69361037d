"""``weir validate`` and ``weir plan``: check a mix file, and plan it from tokenized documents, in seconds.

Neither builds: validate reads the mix file and its paths; plan reads the length statistics of a build (or of
the work a failed build kept), or with ``--compute`` tokenizes what is missing first. Exit statuses: 0 fine,
1 no fitting statistics or an infeasible plan, 2 an invalid mix file, 3 the output busy (``--compute``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console

from contract.errors import WeirError
from pipelines.cli_common import (
    check_paths_or_exit,
    err,
    load_mix_or_exit,
    out,
    print_notes,
    say_error,
    storage_options,
)

if TYPE_CHECKING:
    from mixing import Mix

__all__ = ["plan_cmd", "validate"]


def validate(mix: Path) -> None:
    """Check a mix file; print a one-line summary, or the error with its line and field (exit 2).

    Beyond the schema, in seconds and without tokenizing: each source's URI matches a file (an s3:// one only
    when AWS_* variables give an endpoint or credentials, else a note says it was not checked), an hf
    tokenizer's file is readable, and no {mix_dir} or {env_NAME} is left in a path (a variable not set).
    """
    m = load_mix_or_exit(mix)
    notes = check_paths_or_exit(m, list_sources=True)
    out.print(
        f"{mix}: ok — mix {m.name!r}, {len(m.sources)} sources, {len(m.curriculum)} phases, "
        f"{m.total_steps} steps of {m.sequence.global_batch}×{m.sequence.length} tokens"
    )
    print_notes(notes)


def plan_cmd(
    mix: Path,
    build_dir: Annotated[
        Path | None, typer.Option("--build", help="build folder with the stats (default build/<mix name>)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for machines")] = False,
    compute: Annotated[
        bool,
        typer.Option("--compute", help="when DIR has no stats of this mix, run the stages up to length_stats"),
    ] = False,
) -> None:
    """Print MIX's plan: phases, steps, tokens per source, epochs per source, warnings.

    Reads the tokenized documents of DIR, or of the work a failed build kept beside it (.NAME.cache),
    whichever fits MIX now: same sources, files, tokenizer and rendering; otherwise it exits 1 naming what
    differs. With --compute it tokenizes what is missing (only changed files; into DIR when DIR holds no
    finished build, else into .NAME.cache, which the next build reuses), showing progress. Exit 1 when the
    plan is infeasible (the error names phase, source and tokens).
    """
    from mixing.output.layout import BuildLayout
    from mixing.plan.curriculum_plan import preview_plan
    from pipelines.freshness import stats_folders
    from pipelines.plan_summary import plan_report, print_plan

    m = load_mix_or_exit(mix)
    check_paths_or_exit(m, list_sources=False)  # the freshness check lists the sources next
    root = (build_dir or Path("build") / m.name).resolve()
    options = storage_options(m)
    found = stats_folders(m, root, options)
    fits = [f for f, why in found.items() if not why]
    if not fits and not compute:
        if found:
            why = "; ".join(f"{w}" for w in next(iter(found.values())))
            err.print(
                f"[bold red]stats do not fit the mix[/]: the documents in {next(iter(found))} are not what {mix} "
                f"tokenizes now ({why}); add --compute to tokenize what changed, or build the mix "
                f"(weir build {mix} --out {root})",
                highlight=False,
                soft_wrap=True,
            )
        else:
            err.print(
                f"[bold red]no length statistics[/] in {root}: build the mix first "
                f"(weir build {mix} --out {root}), or add --compute to run the stages up to length_stats",
                highlight=False,
                soft_wrap=True,
            )
        raise typer.Exit(1)
    layout = BuildLayout(fits[0] if fits else _compute_stats(m, root, options, err if as_json else out))
    try:
        p = preview_plan(m, layout.duckdb)
    except WeirError as e:
        say_error("plan infeasible", e)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(plan_report(m, p, layout.root), indent=2))
    else:
        print_plan(out, m, p, layout.root)


def _compute_stats(m: Mix, root: Path, options: dict[str, object] | None, console: Console) -> Path:
    """:func:`pipelines.freshness.compute_stats` with progress on ``console`` (stderr under --json)."""
    from pipelines.display import progress_display, warnings_to
    from pipelines.freshness import compute_stats
    from pipelines.transaction import BuildBusy

    def say(line: str) -> None:
        console.print(line, highlight=False, markup=False)

    try:
        with progress_display(console), warnings_to(say):
            return compute_stats(m, root, options, say)
    except BuildBusy as e:
        say_error("output busy", e)
        raise typer.Exit(3) from None
    except WeirError as e:
        say_error("stats failed", e)
        raise typer.Exit(1) from None
