"""The ``weir`` command line: validate, build, inspect, demo-data, ui."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mixing import MixError, WeirError, load_mix

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, pretty_exceptions_enable=False)
out = Console()
err = Console(stderr=True)

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _load(mix_path: Path):  # type: ignore[no-untyped-def]
    try:
        return load_mix(mix_path)
    except MixError as e:
        err.print(f"[bold red]invalid mix file[/]: {e}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None


@app.command()
def validate(mix: Path) -> None:
    """Check a mix file; print a one-line summary, or the error with its line and field (exit 2)."""
    m = _load(mix)
    out.print(
        f"{mix}: ok — mix {m.name!r}, {len(m.sources)} sources, {len(m.curriculum)} phases, "
        f"{m.total_steps} steps of {m.sequence.global_batch}×{m.sequence.length} tokens"
    )


@app.command()
def build(
    mix: Path,
    out_dir: Annotated[Path | None, typer.Option("--out", help="build folder (default build/<mix name>)")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="ignore the previous build's reusable work")] = False,
) -> None:
    """Build MIX into a folder by materializing its Dagster assets in-process.

    The build happens in a staging folder beside the output and replaces it only when it succeeded, so a
    failed build leaves the previous output (or nothing) in place. Work of the previous output that is
    still valid (tokenized chunks of unchanged files, the tokenizer if its sample is unchanged) is reused.
    """
    import dagster as dg

    from mixing.packed import inspect_build
    from pipelines.build import build_mix, progress_display, reuse_previous

    m = _load(mix)
    dest = (out_dir or Path("build") / m.name).resolve()
    stage = dest.with_name(f".{dest.name}.building-{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    out.print(f"building mix {m.name!r} into {dest}")
    try:
        if dest.is_dir() and not fresh:
            reuse_previous(dest, stage)
        with progress_display(out):
            build_mix(m, stage, say=lambda s: out.print(s, highlight=False, markup=False))
    except (WeirError, dg.DagsterError) as e:
        shutil.rmtree(stage, ignore_errors=True)
        cause = getattr(e, "user_exception", None) or e
        err.print(f"[bold red]build failed[/]: {type(cause).__name__}: {cause}", highlight=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
    if dest.exists():
        dest.rename(old)
    stage.rename(dest)
    shutil.rmtree(old, ignore_errors=True)
    _print_summary(inspect_build(dest))


@app.command()
def inspect(
    build_dir: Path,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON for machines")] = False,
) -> None:
    """Print a build's figures: sequences, tokens, steps, tokens per source, packing metrics.

    Exits 1 when a shard's checksum does not match the manifest (the file is named).
    """
    from mixing.packed import inspect_build
    from mixing.shards import ShardError

    root = build_dir
    if root.name == "shards":
        root = root.parent
    try:
        report = inspect_build(root)
    except ShardError as e:
        err.print(f"[bold red]not a build[/]: {e}", highlight=False)
        raise typer.Exit(1) from None
    if as_json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        _print_summary(report)
    if report["corrupt_files"]:
        err.print(f"[bold red]corrupt shard files[/]: {', '.join(report['corrupt_files'])}")
        raise typer.Exit(1)


def _print_summary(r: dict) -> None:  # type: ignore[type-arg]
    out.print(
        f"mix {r['mix']!r}: {r['steps']} steps, {r['sequences']} sequences of {r['seq_len']} tokens, "
        f"{r['tokens']:,} tokens; packing_efficiency {r['packing_efficiency']:.4f}, "
        f"truncated_docs {r['truncated_docs']:.4f}"
    )
    t = Table("source", "documents", "tokens packed", "tokens dropped", "share")
    for name, s in r["per_source"].items():
        share = s["tokens_packed"] / r["tokens"] if r["tokens"] else 0.0
        t.add_row(
            name,
            f"{s['documents_packed']:,}",
            f"{s['tokens_packed']:,}",
            f"{s['tokens_dropped']:,}",
            f"{share:.3f}",
        )
    out.print(t)


@app.command("demo-data")
def demo_data(
    out_dir: Annotated[Path, typer.Option("--out", help="where the demo corpora go")] = PROJECT_ROOT
    / "build"
    / "demo-data",
) -> None:
    """Generate the demo mix's synthetic corpora (prose and qa); deterministic."""
    from mixing.synthetic import write_demo_data

    counts = write_demo_data(out_dir)
    out.print(f"demo data in {out_dir}: {counts}")


@app.command()
def ui(
    port: Annotated[int, typer.Option(help="port on 127.0.0.1")] = 3000,
    home: Annotated[Path, typer.Option(help="DAGSTER_HOME")] = PROJECT_ROOT / ".dagster_home",
) -> None:
    """Start the Dagster UI on 127.0.0.1 with a project-local DAGSTER_HOME (telemetry off)."""
    home = home.resolve()
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text("telemetry:\n  enabled: false\n")
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    out.print(f"Dagster UI on http://127.0.0.1:{port} (DAGSTER_HOME={home}); Ctrl-C stops it")
    cmd = [
        sys.executable,
        "-m",
        "dagster",
        "dev",
        "-m",
        "pipelines.definitions",
        "-h",
        "127.0.0.1",
        "-p",
        str(port),
    ]
    raise typer.Exit(subprocess.call(cmd, env=env, cwd=PROJECT_ROOT))


if __name__ == "__main__":
    app()
