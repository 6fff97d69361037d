"""What ``weir plan`` prints about a mix's plan: a summary line, its phases and sources as tables, warnings;
or the same figures as JSON for machines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from mixing import Mix
from mixing.plan.curriculum_plan import Plan

__all__ = ["plan_report", "print_plan"]


def plan_report(m: Mix, p: Plan, root: Path) -> dict[str, Any]:
    """The plan ``p`` of ``m`` (from the build folder ``root``) as JSON-ready figures (``inf`` epochs: ``None``)."""
    return {
        "mix": m.name,
        "build": str(root),
        "steps": m.total_steps,
        "seq_len": m.sequence.length,
        "global_batch": m.sequence.global_batch,
        "tokens_per_step": m.sequence.length * m.sequence.global_batch,
        "units": p.units,
        "phases": p.phases.to_dicts(),
        "sources": [
            {k: (None if isinstance(v, float) and v == float("inf") else v) for k, v in row.items()}
            for row in p.per_source.to_dicts()
        ],
        "warnings": list(p.warnings),
    }


def print_plan(console: Console, m: Mix, p: Plan, root: Path) -> None:
    """Print the plan ``p`` of ``m`` (from the build folder ``root``): one summary line, the phases' and the
    sources' tables, then each warning."""
    per_step = m.sequence.length * m.sequence.global_batch
    console.print(
        f"mix {m.name!r}: {m.total_steps} steps × {m.sequence.global_batch} sequences × {m.sequence.length} tokens "
        f"= {m.total_steps * per_step:,} tokens; {p.units:,} document pieces drawn (from {root})",
        highlight=False,
    )
    names = sorted(m.sources)
    t = Table("phase", "steps", "transition", "max_doc_tokens", "tokens", *names, title="phases (tokens per source)")
    for r in p.phases.iter_rows(named=True):
        t.add_row(
            r["phase"],
            f"{r['first_step']}–{r['first_step'] + r['steps'] - 1} ({r['steps']})",
            r["transition"],
            "—" if r["max_doc_tokens"] is None else f"{r['max_doc_tokens']:,}",
            f"{r['tokens_planned']:,}",
            *(f"{r[f'tokens_{s}']:,}" for s in names),
        )
    console.print(t)
    t = Table("source", "documents", "tokens available", "tokens planned", "epochs", "max_epochs", title="sources")
    for r in p.per_source.iter_rows(named=True):
        t.add_row(
            r["source"],
            f"{r['docs_available']:,}",
            f"{r['tokens_available']:,}",
            f"{r['tokens_planned']:,}",
            f"{r['epochs']:.3f}",
            f"{r['max_epochs']:g}",
        )
    console.print(t)
    for w in p.warnings:
        console.print(f"[yellow]warning[/]: {w}", highlight=False)
