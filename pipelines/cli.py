"""weir: mix, tokenize and pack training data for LLM training.

Commands: validate, plan, build, inspect, lookup, epochs, diff, export-megatron, demo-data, ui.

The cheap loop: weir plan MIX (seconds, from tokenized documents), edit the mix file, plan again, then weir build MIX.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from contract.errors import WeirError
from mixing import MixError, load_mix
from pipelines import PROJECT_ROOT

if TYPE_CHECKING:
    import numpy as np

    from mixing import Mix
    from mixing.output.layout import BuildLayout
    from mixing.provenance import Provenance, Slots
    from mixing.report import BuildReport

__all__ = ["app"]

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False)


def _console(stderr: bool = False) -> Console:
    """A console; outside a terminal (a log file, CI) lines and tables are never cut or wrapped to fit
    80 (or $COLUMNS) columns: a log keeps every number whole."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 100_000)


out = _console()
err = _console(stderr=True)
STRICT_EXIT = 4  # --strict: the build is whole but a goal (packing, truncation, mixture_error) was missed


def _load(mix_path: Path):  # type: ignore[no-untyped-def]
    try:
        return load_mix(mix_path)
    except MixError as e:
        err.print(f"[bold red]invalid mix file[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


def _check_paths(m: Mix, list_sources: bool) -> list[str]:
    """:func:`mixing.mixfile.paths.check_paths`: print each problem as an invalid mix file's error (after the
    notes, with ``list_sources``) and exit 2 if any; else return the notes. Sources are listed (``list_sources``)
    with the S3 options of the environment."""
    from mixing.mixfile.paths import check_paths

    found = check_paths(m, _s3_options(m) if list_sources else None, list_sources=list_sources)
    if found.problems:
        _print_notes(found.notes if list_sources else [])
        for problem in found.problems:
            err.print(f"[bold red]invalid mix file[/]: {escape(problem)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2)
    return found.notes


def _print_notes(notes: list[str]) -> None:
    for note in notes:
        err.print(f"[yellow]note[/]: {escape(note)}", highlight=False, soft_wrap=True)


def _s3_options(m: Mix) -> dict[str, object] | None:
    """fsspec options from the ``AWS_*`` variables when a source is remote (dagster imported only then), else None."""
    try:
        uris = [m.source_uri(name) for name in m.sources]
    except MixError:  # a variable not set: check_paths names it
        return None
    if all("://" not in u or u.startswith("file://") for u in uris):
        return None
    if not any(k.startswith("AWS_") and v for k, v in os.environ.items()):
        return None  # nothing to list with (and no dagster to import for it)
    from pipelines.resources import mix_storage_options

    return mix_storage_options(m)


@app.command()
def validate(mix: Path) -> None:
    """Check a mix file; print a one-line summary, or the error with its line and field (exit 2).

    Beyond the schema, in seconds and without tokenizing: each source's URI matches a file (an s3:// one only
    when AWS_* variables give an endpoint or credentials, else a note says it was not checked), an hf
    tokenizer's file is readable, and no {mix_dir} or {env_NAME} is left in a path (a variable not set).
    """
    m = _load(mix)
    notes = _check_paths(m, list_sources=True)
    out.print(
        f"{mix}: ok — mix {m.name!r}, {len(m.sources)} sources, {len(m.curriculum)} phases, "
        f"{m.total_steps} steps of {m.sequence.global_batch}×{m.sequence.length} tokens"
    )
    _print_notes(notes)


@app.command()
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
        str, typer.Option("--policy", help="how --feedback turns losses into weights (loss_proportional)")
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
    from contract.store import is_local, redact_url

    m = _load(mix)
    remote = out_dir is not None and not is_local(out_dir)
    dest: Path | str = out_dir if out_dir and remote else Path(out_dir or Path("build") / m.name).resolve()
    run.dest = dest  # named by a failure from here on, even one while importing what follows
    from mixing.output.layout import BuildLayout
    from mixing.report import inspect_build, saved_report
    from pipelines.build import progress_display
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
            err.print(f"[bold red]invalid continuation[/]: {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
    if feedback is not None:
        from mixing.feedback import FeedbackError, apply_feedback

        try:
            m = apply_feedback(m, feedback, policy)
        except FeedbackError as e:
            err.print(f"[bold red]invalid feedback[/]: {e}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        note = m.continues.feedback if m.continues is not None else None
        if note is not None:
            for phase, weights in note.weights.items():
                shown = ", ".join(f"{s} {w:.4f}" for s, w in weights.items())
                out.print(f"feedback ({policy}): phase {phase!r} weights {shown}", highlight=False, markup=False)
    _check_paths(m, list_sources=False)  # the build lists the sources first thing
    out.print(f"building mix {m.name!r} into {redact_url(str(dest))}" + (f" on {engine}" if engine != "local" else ""))
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
        err.print(f"[bold red]output busy[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(3) from None
    layout = storage_resource(dest, per_mix=False, bound=False).layout(m) if remote else BuildLayout(Path(dest))
    report = _with_stream(saved_report(layout) or inspect_build(layout), layout)  # the packed_shards asset's figures
    missed = print_summary(out, report)
    out.print(f"recorded in the Dagster instance at {dagster_home()} (weir ui shows it)", highlight=False)
    _exit_if_missed(missed, strict)


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
    """:func:`pipelines.transaction.kept_work` of a local ``dest`` when the build got as far as importing it (a
    build out of memory while starting may not import it again)."""
    transaction = sys.modules.get("pipelines.transaction")
    if transaction is None or not isinstance(dest, Path):
        return None
    return transaction.kept_work(dest)  # type: ignore[no-any-return]


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
    name = out_dir or str(Path("build") / _load(mix).name)
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


def _exit_if_missed(missed: list[str], strict: bool, quiet: bool = False) -> None:
    """Name the missed goals on stderr (unless ``quiet``: --json keeps stderr for errors); exit 4 if ``strict``."""
    if missed and not quiet:
        err.print(f"[yellow]goal missed[/]: {'; '.join(missed)}", highlight=False, soft_wrap=True)
    if missed and strict:
        raise typer.Exit(STRICT_EXIT)


@app.command()
def inspect(
    build_dir: Annotated[str, typer.Argument(help="a build folder, or the s3:// URL weir build published it to")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for machines")] = False,
    strict: Annotated[bool, typer.Option("--strict", help=f"exit {STRICT_EXIT} when a goal is missed")] = False,
) -> None:
    """Print a build's figures: sequences, tokens, steps, tokens per source, packing metrics.

    Recomputes them from the shards, verifying every checksum. Exits 1 with one line naming the file when
    the build cannot be read (a missing, damaged or edited manifest, shard file or DuckDB file) or a
    shard's checksum does not match the manifest; with --strict, exits 4 when a goal is missed. A build in
    object storage is read with the plan in the working folder of the machine that built it ($WEIR_WORK_DIR).
    """
    from mixing.output.layout import BuildLayout
    from mixing.report import inspect_build
    from pipelines.summary import missed_goals, print_summary

    root = _build_root(build_dir)
    try:
        report = _with_stream(inspect_build(root), root)
    except WeirError as e:
        err.print(f"[bold red]not a readable build[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    missed = missed_goals(report)
    shards = BuildLayout.of(root).shards_url
    if as_json:  # the figures as they are (machines judge them); --strict still exits 4
        print(json.dumps(report.as_json(), indent=2, sort_keys=True))
    else:
        print_summary(out, report)
    if not report.manifest_sealed:
        err.print(
            f"[yellow]note[/]: {shards}/manifest.json (format {report.format_version}) was written "
            "before manifests carried their own checksum (manifest_sha256): edits to it cannot be detected; "
            "rebuild to add one",
            highlight=False,
            soft_wrap=True,
        )
    if report.corrupt_files:
        bad = "; ".join(f"{shards}/{name}: {why}" for name, why in report.file_problems.items())
        err.print(f"[bold red]corrupt shard files[/]: {bad}", highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    _exit_if_missed(missed, strict, quiet=as_json)


def _build_root(build_dir: str) -> Path | BuildLayout:
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


def _with_stream(report: BuildReport, root: Path | BuildLayout) -> BuildReport:
    """``report`` plus ``mixture_error_stream`` (:func:`assets.stream.stream_report`) when the mix file
    regroups steps (otherwise the trainer's stream is the build's steps)."""
    if _regroups(root):
        from assets.stream import stream_report

        return report.model_copy(update={"mixture_error_stream": stream_report(root)})
    return report


def _regroups(root: Path | BuildLayout) -> bool:
    from mixing.output.layout import BuildLayout

    return BuildLayout.of(root).shard_set().manifest.regrouping.window > 1


@app.command()
def lookup(
    build_dir: Annotated[str, typer.Argument(help="a build folder, or the s3:// URL weir build published it to")],
    step: Annotated[int, typer.Option("--step", help="the training step, as the loader hands it out")],
    rank: Annotated[
        int | None, typer.Option("--rank", help="only this DP rank's share of the step (with --dp)")
    ] = None,
    dp: Annotated[int, typer.Option("--dp", help="DP ranks the step is dealt to")] = 1,
    cp: Annotated[int, typer.Option("--cp", help="CP ranks each sequence is split over (with --cp-rank)")] = 1,
    cp_rank: Annotated[int, typer.Option("--cp-rank", help="the CP rank whose token ranges to show")] = 0,
    cp_split: Annotated[str, typer.Option("--cp-split", help="zigzag, thd, contiguous or sequence_zigzag")] = "zigzag",
    text: Annotated[bool, typer.Option("--text", help="also print each segment's text, decoded")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for machines")] = False,
) -> None:
    """Print every segment of training step STEP: its sequence, source, file, record, token range in its document.

    The step is the one a loader with the build's own balance hands out (PackedDataset's default Balance(): with
    balance.regroup a training step gathers sequences of several build steps; without, it is the build step).
    --rank R --dp D: only the sequences DP rank R of D reads, in its reading order. --cp C --cp-rank K: the same
    documents (a CP group trains on the same sequences and reduces one loss, so a spike on one CP rank is a
    spike of these documents), each also listing the token ranges of its document that CP rank K holds under
    --cp-split: zigzag (weir's per-document split, the loader's items), thd (per document, as StepLoader cuts
    it for Transformer Engine), contiguous or sequence_zigzag (slices of the sequence: a rank may hold none of
    a document). --text decodes each segment's tokens as the shards hold them, BOS/EOS left out: a whole
    document's text is its record as rendered. Exit 1 with one line when the build, the step or a source's
    document index cannot be read.
    """
    from mixing.provenance import Provenance

    try:
        prov = Provenance(_build_root(build_dir))
        seqs, slots, where = _lookup_share(prov, step, rank, dp, cp, cp_rank, cp_split)
        pieces = prov.lookup(seqs, text=text, slots=slots)
    except WeirError as e:
        err.print(f"[bold red]cannot look it up[/]: {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except ValueError as e:  # the loader refuses the world or the split (World, LoaderConfig, the planner)
        err.print(
            f"[bold red]cannot look it up[/]: {escape(str(e))}; give the --rank/--dp/--cp/--cp-split of the "
            "training run",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(1) from None
    tokens = sum(p.length for p in pieces)
    if as_json:
        report = {"build": prov.layout.url, "step": step, **where, "sequences": [int(s) for s in seqs]}
        report |= {"tokens": tokens, "segments": [p.as_json() for p in pieces]}
        print(json.dumps(report, indent=2, ensure_ascii=False))
        return
    share = "".join(f", {k.upper()} rank {v['rank']} of {v['size']}" for k, v in where.items() if k in ("dp", "cp"))
    split = f" ({cp_split})" if cp > 1 else ""
    out.print(
        f"training step {step}{share}{split}: {len(seqs)} sequences, {len(pieces)} segments, {tokens:,} tokens",
        highlight=False,
        markup=False,
    )
    last = None
    for p in pieces:
        if p.sequence != last:
            out.print(f"sequence {p.sequence} (build step {p.step})", highlight=False, markup=False)
            last = p.sequence
        held = "" if p.held is None else "  held " + (" ".join(f"{a}:{b}" for a, b in p.held) or "none")
        out.print(
            f"  {p.source}  {p.file}  {p.record}  tokens {p.start}:{p.end} of {p.n_tokens} ({p.length}){held}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        if p.text is not None:
            out.print(f"    {json.dumps(p.text, ensure_ascii=False)}", highlight=False, markup=False, soft_wrap=True)


def _lookup_share(
    prov: Provenance, step: int, rank: int | None, dp: int, cp: int, cp_rank: int, cp_split: str
) -> tuple[np.ndarray, Slots | None, dict[str, dict[str, object]]]:
    """The sequences of training ``step`` (or DP rank ``rank``'s, in its reading order), the CP rank's slots
    (None without CP) and the share for the JSON. The loader decides (its planner under the build's balance,
    its checks of the world and the split); with no regroup, no DP rank and no CP a training step is the build
    step, and the loader (torch) is not imported."""
    import numpy as np

    from mixing.provenance import ProvenanceError

    seqs = prov.step_sequences(step)  # a step the build lacks: one line naming its steps
    if rank is None and dp > 1:
        raise ProvenanceError(f"--dp {dp} names no rank: add --rank R (0..{dp - 1}) for that rank's share of the step")
    if cp == 1 and cp_rank:
        raise ProvenanceError(f"--cp-rank {cp_rank} needs --cp C, the CP ranks (more than {cp_rank})")
    where: dict[str, dict[str, object]] = {}
    m = prov.shards.manifest
    if rank is None and m.regrouping.window == 1 and cp == 1:
        return seqs, None, where
    from loaders.config import LoaderConfig
    from loaders.context_parallel import SPLITS
    from loaders.stream import settings_planner
    from loaders.world import World

    world = World(dp_rank=rank or 0, dp_size=dp, cp_rank=cp_rank, cp_size=cp)
    settings = LoaderConfig(world=world, cp_split=cp_split).resolve(m)
    if rank is not None or m.regrouping.window > 1:
        planner = settings_planner(prov.shards, settings.balance)
        if rank is not None:
            planner.check_world(dp)
            seqs = np.asarray(planner.assignment(step, dp)[rank], dtype=np.int64)
            where["dp"] = {"rank": rank, "size": dp}
        else:
            seqs = planner.step_sequences(step)
    if cp == 1:
        return seqs, None, where
    where["cp"] = {"rank": cp_rank, "size": cp, "split": cp_split}
    if cp_split in ("zigzag", "thd"):  # per document: a sequence's own segments decide
        how = SPLITS[cp_split]
        return seqs, lambda lengths: how(lengths, cp, cp_rank), where
    fixed = SPLITS[cp_split](np.array([m.seq_len]), cp, cp_rank)  # slices of the sequence: the same in every one
    return seqs, lambda lengths: fixed, where


@app.command()
def epochs(
    build_dir: Annotated[str, typer.Argument(help="a build folder, or the s3:// URL weir build published it to")],
    steps: Annotated[str | None, typer.Option("--steps", help="build steps A:B (A to B-1; default all)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for machines")] = False,
) -> None:
    """Print per source what build steps A..B-1 took of it: tokens seen, unique tokens, repeated tokens, epochs.

    A piece of a document (doc_id, start) counts once towards unique tokens however often it is drawn; epochs
    = tokens seen ÷ the source's tokens (its docs.parquet's n_tokens), fractional. Exit 1 with one line when the
    build or a source's document index cannot be read, or A:B is not a span of its steps.
    """
    from rich.table import Table

    from mixing.provenance import Provenance, step_range

    try:
        prov = Provenance(_build_root(build_dir))
        report = prov.epochs(*step_range(steps, prov.steps))
    except WeirError as e:
        err.print(f"[bold red]cannot count it[/]: {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(report.as_json(), indent=2))
        return
    table = Table(title=f"build steps {report.first}..{report.stop - 1} of {prov.layout.url}")
    for name in ("source", "tokens", "seen", "unique", "repeated", "epochs"):
        table.add_column(name, justify="left" if name == "source" else "right")
    for s in report.sources:
        table.add_row(
            s.source,
            f"{s.tokens:,}",
            f"{s.tokens_seen:,}",
            f"{s.unique_tokens:,}",
            f"{s.repeated_tokens:,}",
            f"{s.epochs:.3f}",
        )
    out.print(table)


@app.command()
def diff(
    a: Annotated[str, typer.Argument(help="a build folder or URL (the base, for a continuation)")],
    b: Annotated[str, typer.Argument(help="another build folder or URL")],
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for machines")] = False,
) -> None:
    """Print where two builds' training steps part: the steps whose digests are equal, the first that differs,
    and where B continues A. Exits 1 with one line when a build cannot be read."""
    from pipelines.diff import diff_builds, open_shards
    from pipelines.resources import storage_resource

    try:
        opened = [open_shards(x, storage_resource(x, per_mix=False, bound=False).storage_options()) for x in (a, b)]
        result = diff_builds(*opened)
    except WeirError as e:
        err.print(f"[bold red]not a readable build[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(result.as_json(), indent=2, sort_keys=True))
        return
    for line in result.lines():
        out.print(line, highlight=False, markup=False)


@app.command()
def calibrate(
    device: Annotated[str, typer.Option("--device", help="cuda (default) or cpu, to try the command")] = "cuda",
    min_len: Annotated[int, typer.Option("--min-len", help="shortest document timed (tokens)")] = 1024,
    max_len: Annotated[int, typer.Option("--max-len", help="longest document timed (tokens)")] = 131072,
    heads: Annotated[int, typer.Option("--heads", help="attention heads of the layer timed")] = 32,
    head_dim: Annotated[int, typer.Option("--head-dim", help="dimension of a head")] = 128,
) -> None:
    """Fit the cost model's compute terms (α·l² + β·l + γ seconds per document) to one attention layer's forward
    and backward on this machine's GPU, and print them as the mix file's balance.cost. Exits 2 without a GPU."""
    import torch

    from pipelines.calibrate import measure

    if device.startswith("cuda") and not torch.cuda.is_available():
        err.print(
            "[bold red]no GPU here[/]: weir calibrate times attention on the training cluster's GPU; run it on a "
            "GPU node (or --device cpu to try the command, not for real figures)",
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(2)
    try:
        c = measure(device, min_len, max_len, heads, head_dim)
    except ValueError as e:
        err.print(f"[bold red]cannot calibrate[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    for n, s in zip(c.lengths.tolist(), c.seconds.tolist(), strict=True):
        out.print(f"l = {n:>7,}  {s * 1e3:10.3f} ms", highlight=False)
    out.print(
        f"fit on {name}: {c.alpha:.4g}·l² + {c.beta:.4g}·l + {c.gamma:.4g} s (worst point off by {c.worst:.1%})",
        highlight=False,
        markup=False,
    )
    print(c.mix_yaml().replace("fitted on " + device, "fitted on " + name))


@app.command("export-megatron")
def export_megatron(
    build_dir: Path,
    prefix: Path,
    unit: Annotated[str, typer.Option(help="segment (one Megatron sequence per document) or sequence")] = "segment",
) -> None:
    """Write the build's shards as a Megatron-LM indexed dataset PREFIX.bin + PREFIX.idx."""
    from contract.shards import ShardError, ShardSet
    from mixing.output.megatron import export_megatron as _export

    root = build_dir / "shards" if (build_dir / "shards").is_dir() else build_dir
    if unit not in ("segment", "sequence"):
        err.print(f"[bold red]--unit[/] must be segment or sequence, not {unit!r}")
        raise typer.Exit(2)
    try:
        r = _export(ShardSet(root), prefix, unit)  # type: ignore[arg-type]
    except ShardError as e:
        err.print(f"[bold red]not a build[/]: {e}", highlight=False)
        raise typer.Exit(1) from None
    out.print(r["summary"], highlight=False, soft_wrap=True)  # weir's words, and once how they map to Megatron's


@app.command("plan")
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
    from pipelines.resources import mix_storage_options

    m = _load(mix)
    _check_paths(m, list_sources=False)  # the freshness check lists the sources next
    root = (build_dir or Path("build") / m.name).resolve()
    options = mix_storage_options(m)
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
        err.print(f"[bold red]plan infeasible[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(plan_report(m, p, layout.root), indent=2))
    else:
        print_plan(out, m, p, layout.root)


def _compute_stats(m, root: Path, options: dict[str, object] | None, console: Console) -> Path:  # type: ignore[no-untyped-def]
    """:func:`pipelines.freshness.compute_stats` with progress on ``console`` (stderr under --json)."""
    from pipelines.build import progress_display, warnings_to
    from pipelines.freshness import compute_stats
    from pipelines.transaction import BuildBusy

    def say(line: str) -> None:
        console.print(line, highlight=False, markup=False)

    try:
        with progress_display(console), warnings_to(say):
            return compute_stats(m, root, options, say)
    except BuildBusy as e:
        err.print(f"[bold red]output busy[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(3) from None
    except WeirError as e:
        err.print(f"[bold red]stats failed[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None


@app.command("demo-data")
def demo_data(
    out_dir: Annotated[Path, typer.Option("--out", help="where the demo corpora go")] = PROJECT_ROOT
    / "build"
    / "demo-data",
) -> None:
    """Generate the demo mix's synthetic corpora (prose and qa); deterministic."""
    from mixing.ingest.synthetic import write_demo_data

    counts = write_demo_data(out_dir)
    out.print(f"demo data in {out_dir}: {counts}")


@app.command()
def ui(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 3000,
    home: Annotated[
        Path | None, typer.Option(help="Dagster instance folder (default $DAGSTER_HOME, else .dagster_home)")
    ] = None,
) -> None:
    """Start the Dagster UI on 127.0.0.1 (telemetry off).

    Its instance is the one weir build records into ($DAGSTER_HOME, else the project's .dagster_home),
    so command-line builds show there with their checks and plots.
    """
    import importlib.util

    from pipelines.instance import dagster_home
    from pipelines.ui import dagster_dev

    if importlib.util.find_spec("dagster_webserver") is None:
        err.print("weir ui needs the ui extra (dagster-webserver is not installed): pip install 'weir[ui]'")
        raise typer.Exit(2)
    home = dagster_home(home)
    out.print(f"Dagster UI on http://127.0.0.1:{port} (DAGSTER_HOME={home}); Ctrl-C stops it")
    raise typer.Exit(dagster_dev(port, home, out, err))


if __name__ == "__main__":
    app()
