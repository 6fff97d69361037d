"""The tools around builds: ``weir calibrate`` (the cost model on this GPU), ``weir export-megatron``,
``weir demo-data`` and ``weir ui`` (the Dagster UI on the instance builds record into)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from pipelines import PROJECT_ROOT
from pipelines.cli_common import err, out, say_error

__all__ = ["calibrate", "demo_data", "export_megatron", "ui"]


def calibrate(
    device: Annotated[str, typer.Option("--device", help="cuda (default) or cpu, to try the command")] = "cuda",
    min_len: Annotated[int, typer.Option("--min-len", help="shortest document timed (tokens)")] = 1024,
    max_len: Annotated[int, typer.Option("--max-len", help="longest document timed (tokens)")] = 131072,
    heads: Annotated[int, typer.Option("--heads", help="attention heads of the layer timed")] = 32,
    head_dim: Annotated[int, typer.Option("--head-dim", help="dimension of a head")] = 128,
) -> None:
    """Fit the cost model's compute terms (α·Σl² + β·Σl + δ per document + γ per micro-batch, seconds) to one
    attention layer's forward and backward on this machine's GPU (single documents and packed micro-batches), and
    print them as the mix file's balance.cost. Exits 2 without a GPU."""
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
        say_error("cannot calibrate", e)
        raise typer.Exit(1) from None
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    for m, n, t in zip(c.documents.tolist(), c.lengths.tolist(), c.seconds.tolist(), strict=True):
        out.print(f"{m:>3} × {n:>7,} tokens  {t * 1e3:10.3f} ms", highlight=False)
    out.print(
        f"fit on {name} ({c.attention}): {c.alpha:.4g}·Σl² + {c.beta:.4g}·Σl + {c.delta:.4g} per document + "
        f"{c.gamma:.4g} per micro-batch, seconds (worst point off by {c.worst:.1%})",
        highlight=False,
        markup=False,
    )
    print(c.mix_yaml().replace("fitted on " + device, "fitted on " + name))


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
        err.print(f"[bold red]--unit[/] must be segment or sequence, not {escape(repr(unit))}")
        raise typer.Exit(2)
    try:
        r = _export(ShardSet(root), prefix, unit)  # type: ignore[arg-type]
    except ShardError as e:
        say_error("not a build", e)
        raise typer.Exit(1) from None
    out.print(r["summary"], highlight=False, soft_wrap=True)  # weir's words, and once how they map to Megatron's


def demo_data(
    out_dir: Annotated[Path, typer.Option("--out", help="where the demo corpora go")] = PROJECT_ROOT
    / "build"
    / "demo-data",
) -> None:
    """Generate the demo mix's synthetic corpora (prose and qa); deterministic."""
    from mixing.ingest.synthetic import write_demo_data

    counts = write_demo_data(out_dir)
    out.print(f"demo data in {out_dir}: {counts}", markup=False)


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
    out.print(f"Dagster UI on http://127.0.0.1:{port} (DAGSTER_HOME={home}); Ctrl-C stops it", markup=False)
    raise typer.Exit(dagster_dev(port, home, out, err))
