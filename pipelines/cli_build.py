"""``weir build``: build a mix into a folder or URL, and end a failed build in one line.

The build runs in-process (its Dagster assets materialized by :func:`pipelines.transaction.build_output`), or in a
watched child under an address-space limit (:mod:`pipelines.memory_guard`). Exit statuses: 0 built, 1 failed (one
``build failed: ...`` line), 2 an invalid mix, continuation or feedback, 3 the output busy, 4 a goal missed under
``--strict``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.markup import escape

from contract.errors import WeirError
from mixing import MixError
from mixing.loss_policy import POLICIES
from pipelines.cli_common import (
    STRICT_EXIT,
    check_paths_or_exit,
    err,
    exit_if_missed,
    load_mix_or_exit,
    out,
    say_error,
    with_stream,
)

__all__ = ["build"]


def build(
    ctx: typer.Context,
    mix: Path,
    out_dir: Annotated[
        str | None,
        typer.Option("--out", help="build folder or URL s3://bucket/prefix (default build/<mix>)"),
    ] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="ignore the previous build's reusable work")] = False,
    engine: Annotated[
        str, typer.Option("--engine", help="where tokenizing and shard writing run: local (this process) or ray")
    ] = "local",
    ray_address: Annotated[
        str | None, typer.Option("--ray-address", help="the Ray cluster (host:port); default $WEIR_RAY_ADDRESS")
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="if another build is writing the same folder, wait for it (else exit 3)")
    ] = False,
    strict: Annotated[bool, typer.Option("--strict", help=f"exit {STRICT_EXIT} when a goal is missed")] = False,
    base: Annotated[
        str | None,
        typer.Option(
            "--continue", help="continue this build (folder or URL): its steps before --at are kept as they are"
        ),
    ] = None,
    at: Annotated[int | None, typer.Option("--at", help="the first step that follows MIX (with --continue)")] = None,
    feedback: Annotated[
        Path | None,
        typer.Option(
            "--feedback", help="a per-source loss log (step, source, loss_sum, tokens): MIX reweighted from --at"
        ),
    ] = None,
    policy: Annotated[
        str,
        typer.Option("--policy", help=f"how --feedback turns losses into weights: {', '.join(POLICIES)}"),
    ] = "loss_proportional",
    debug: Annotated[
        bool, typer.Option("--debug", help="when the build fails, print the traceback before the one line")
    ] = False,
) -> None:
    """Build MIX into a folder by materializing its Dagster assets in-process.

    The build happens in a staging folder beside the output and replaces it only when it succeeded, so a
    failed or killed build leaves the previous output (or nothing) in place; the next build removes what a
    killed one left. Work of the previous output that is still valid (tokenized chunks of unchanged files,
    the tokenizer if its sample is unchanged) is reused. One build at a time per output folder: a second
    one exits 3 naming the first one's pid, or waits with --wait.

    With --out s3://bucket/prefix the build is published there (S3 settings from AWS_ENDPOINT_URL,
    AWS_ACCESS_KEY_ID, ...): every stage commits last, so a killed build leaves nothing a reader trusts. With
    --engine ray, tokenizing and shard writing run as tasks on the Ray cluster at --ray-address.

    A failed build keeps what it tokenized beside the output (.NAME.cache): the next build reuses it, and
    weir plan MIX plans from it in seconds. The run is recorded in the project's Dagster instance
    (DAGSTER_HOME, else .dagster_home), so it shows in weir ui with its checks and plots. Warnings of the
    stages are printed; a missed goal is marked, and with --strict exits 4.

    With --continue BASE --at N the build is a continuation: its steps before N are BASE's, byte for byte (its
    shard files, linked), and from N on it follows MIX, each source's draw going on where BASE left it. A
    change of MIX that would alter steps before N is refused, naming the field. `weir diff BASE OUT` proves it.
    With --feedback LOSSES (the per-source loss log the training examples write) the weights of MIX's phases from
    N on come from the run's losses under --policy, recorded in the manifest: the same log, the same build.

    A failure ends in one line, `build failed: ...`, naming the path, the stage and what to do next (a full
    disk, no free inodes, a read-only folder, a dead Ray head, out of memory, ...); --debug prints the
    traceback before it. Under an address-space limit (ulimit -v) the build runs in a watched child process
    that ends in that line even when native code aborts or stalls (docs/operations.md, "Memory").
    """
    from pipelines.memory_guard import needs_guard

    if needs_guard():
        raise typer.Exit(_guarded_build(ctx, mix, out_dir, engine, debug))
    run = _Run(mix)
    try:
        _build(run, mix, out_dir, fresh, engine, ray_address, wait, strict, base, at, feedback, policy)
    except (typer.Exit, KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as e:  # BaseException: a Rust panic reaches Python as one (pyo3's PanicException)
        _build_failed(e, run, debug)


def _build(
    run: _Run,
    mix: Path,
    out_dir: str | None,
    fresh: bool,
    engine: str,
    ray_address: str | None,
    wait: bool,
    strict: bool,
    base: str | None,
    at: int | None,
    feedback: Path | None,
    policy: str,
) -> None:
    """``weir build``'s work (see :func:`build`); a failure is raised for :func:`_build_failed`, bar a busy output
    (exit 3) and an invalid mix, continuation or feedback (exit 2)."""
    from contract.redaction import redact_url
    from contract.store import is_local

    m = load_mix_or_exit(mix)
    remote = out_dir is not None and not is_local(out_dir)
    dest: Path | str = out_dir if out_dir and remote else Path(out_dir or Path("build") / m.name).resolve()
    run.dest = dest  # named by a failure from here on, even one while importing what follows
    from mixing.output.layout import BuildLayout
    from mixing.report import inspect_build, saved_report
    from pipelines.display import progress_display
    from pipelines.instance import dagster_home, project_instance
    from pipelines.memory_guard import STATUS_ENV, warm_pools
    from pipelines.ray_head import check_head, watch_head
    from pipelines.resources import engine_resource, storage_resource
    from pipelines.summary import print_summary
    from pipelines.transaction import BuildBusy, build_output

    if (base is None) != (at is None):
        err.print("[bold red]error[/]: --continue and --at go together (the base build and the first new step)")
        raise typer.Exit(2)
    if base is not None and at is not None:
        try:
            m = m.continuing(base, at)
        except MixError as e:
            say_error("invalid continuation", e)
            raise typer.Exit(2) from None
    if feedback is not None:
        from mixing.feedback import FeedbackError, apply_feedback, unlogged
        from pipelines.summary import per_source

        try:
            m = apply_feedback(m, feedback, policy)
        except FeedbackError as e:
            say_error("invalid feedback", e)
            raise typer.Exit(2) from None
        note = m.continues.feedback if m.continues is not None else None
        if note is not None:
            first, end = note.steps
            missing = unlogged(note)
            kept = f"; no losses of {', '.join(missing)} logged: weight kept" if missing else ""
            line = f"feedback ({policy}): factors {per_source(note.factor)} (steps {first}..{end - 1}){kept}"
            out.print(line, highlight=False, markup=False)
            for phase, weights in note.weights.items():
                line = f"feedback ({policy}): phase {phase!r} weights {per_source(weights)}"
                out.print(line, highlight=False, markup=False)
    check_paths_or_exit(m, list_sources=False)  # the build lists the sources first thing
    on = f" on {engine}" if engine != "local" else ""
    out.print(f"building mix {m.name!r} into {redact_url(str(dest))}{on}", highlight=False, markup=False)
    if STATUS_ENV in os.environ:  # the watched child under an address-space limit: start the pools while there is room
        warm_pools()
    try:
        resource = engine_resource(kind=engine, address=ray_address)
        runner = resource.engine()
        address = getattr(runner, "address", None) if runner.name == "ray" else None
        check_head(address)  # a dead head: one line now, not Ray's minutes of retries
        instance = project_instance()
        with watch_head(address, lambda lost: _head_lost(lost, run)), progress_display(out):
            build_output(
                m,
                dest,
                fresh=fresh,
                wait=wait,
                say=run.say,
                instance=instance,
                engine=resource,
            )
    except BuildBusy as e:
        say_error("output busy", e)
        raise typer.Exit(3) from None
    layout = storage_resource(dest, per_mix=False, bound=False).layout(m) if remote else BuildLayout(Path(dest))
    report = with_stream(saved_report(layout) or inspect_build(layout), layout)  # the packed_shards asset's figures
    missed = print_summary(out, report)
    out.print(f"recorded in the Dagster instance at {dagster_home()} (weir ui shows it)", highlight=False, markup=False)
    exit_if_missed(missed, strict)


class _Run:
    """What a build's failure line names: the mix, the output (once known) and the last stage the build announced,
    which a watched child (:mod:`pipelines.memory_guard`) also records for its watcher."""

    _STEP = re.compile(r"  ([a-z_]+)( \[.+\])?")

    def __init__(self, mix: Path) -> None:
        self.mix = mix
        self.dest: Path | str | None = None
        self.said: str | None = None

    def say(self, line: str) -> None:
        """Print a line of the build (``say`` of :func:`pipelines.transaction.build_output`), noting its stage."""
        from pipelines.memory_guard import WAITING, note_stage

        step = self._STEP.fullmatch(line)
        if step is not None:
            self.said = line.strip()
            note_stage(self.said)
        elif line.startswith("waiting for"):
            note_stage(WAITING)
        out.print(line, highlight=False, markup=False)


def _build_failed(e: BaseException, run: _Run, debug: bool) -> NoReturn:
    """Print the build's failure as one line (:func:`pipelines.failures.explain`; the traceback before it with
    ``--debug``) and exit 1. A plain error keeps its hint: where the tokenized work is kept, and how to plan from it."""
    import traceback

    from pipelines.failures import explain

    if debug:
        traceback.print_exception(e, file=sys.stderr)
    dest = run.dest if run.dest is not None else run.mix
    cache = _kept_work(dest)
    failure = explain(e, dest, said=run.said, cache=cache)
    line = failure.line
    if failure.kind == "error" and not isinstance(failure.error, WeirError) and not debug:
        line += " (--debug prints the traceback)"
    err.print(f"[bold red]build failed[/]: {escape(line)}", highlight=False, soft_wrap=True)
    if failure.kind == "error" and cache is not None:
        err.print(
            f"kept the tokenized documents in {cache}: fix the mix, check it with `weir plan {run.mix} --build "
            f"{dest}` (seconds, no tokenizing), then build again (only changed files are tokenized)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    raise typer.Exit(1) from None


def _kept_work(dest: Path | str) -> Path | None:
    """:func:`pipelines.kept_work.kept_work` of a local ``dest`` when the build got as far as importing it (a
    build out of memory while starting may not import it again)."""
    kept = sys.modules.get("pipelines.kept_work")
    if kept is None or not isinstance(dest, Path):
        return None
    return kept.kept_work(dest)  # type: ignore[no-any-return]


def _head_lost(lost: Exception, run: _Run) -> None:
    """The Ray head stopped answering mid-build (:func:`pipelines.ray_head.watch_head`, on its thread): the main
    thread waits inside Ray, which would end the process without a word; print the line and end it now."""
    from pipelines.failures import explain

    out.show_cursor(True)  # the progress display is left running
    failure = explain(lost, run.dest if run.dest is not None else run.mix, said=run.said)
    stage = run.dest.with_name(f".{run.dest.name}.building-{os.getpid()}") if isinstance(run.dest, Path) else None
    left = f"; its work in {stage} is removed by the next build" if stage is not None and stage.is_dir() else ""
    err.print(f"[bold red]build failed[/]: {escape(failure.line + left)}", highlight=False, soft_wrap=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


def _guarded_build(ctx: typer.Context, mix: Path, out_dir: str | None, engine: str, debug: bool) -> int:
    """Run this ``weir build`` in a watched child under the address-space limit (:mod:`pipelines.memory_guard`):
    the same arguments, as parsed; the child's exit status, or 1 after the one line of a child that died."""
    from pipelines.failures import address_limit
    from pipelines.memory_guard import supervise

    argv = [ctx.command.name or "build"]
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if isinstance(param, typer.core.TyperArgument):
            argv.append(str(value))
        elif getattr(param, "is_flag", False):
            argv += [param.opts[0]] if value else []
        elif value is not None and value != param.default:
            argv += [param.opts[0], str(value)]
    name = out_dir or str(Path("build") / load_mix_or_exit(mix).name)
    dest: Path | str = Path(name).resolve() if "://" not in name else name
    limit = address_limit()
    assert limit is not None, "needs_guard() said a limit is set"

    def staging(pid: int) -> Path | None:
        return dest.with_name(f".{dest.name}.building-{pid}") if isinstance(dest, Path) else None

    return supervise(argv, limit, dest, engine=engine, staging=staging, debug=debug, say=lambda line: _say_failed(line))


def _say_failed(line: str) -> None:
    """Print the watcher's ``build failed: ...`` line as the build's own are printed."""
    err.print(
        f"[bold red]build failed[/]: {escape(line.removeprefix('build failed: '))}", highlight=False, soft_wrap=True
    )
