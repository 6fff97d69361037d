"""Small PNG plots for Dagster metadata, embedded in markdown as data URIs (the UI renders them inline).

Matplotlib ``Figure`` objects used directly (no pyplot: no global state, no display needed); each
function returns one markdown image line.
Deterministic for the same input (no timestamps in the PNG). Matplotlib is imported by the first plot, not with
the assets: ~0.6 s that every process loading the definitions paid (the UI's code server, each step's process)
while two stages of a build draw.
"""

from __future__ import annotations

import base64
import io
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["length_histogram_md", "mixture_area_md", "png_markdown"]


def png_markdown(fig: Figure, alt: str) -> str:
    """``fig`` as a markdown image with a base64 PNG data URI."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    return f"![{alt}](data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()})"


def length_histogram_md(histogram: pl.DataFrame, seq_len: int | None = None) -> str:
    """Documents per log2 length bucket, one line per source (a ``length_histogram`` frame).

    The y axis is the share of the source's documents, so small and large sources compare; a dashed line
    marks the sequence length S.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    for src in sorted(set(histogram["source"].to_list()) - {"*"}):
        h = histogram.filter(pl.col("source") == src).sort("lo")
        lo = h["lo"].to_numpy()
        share = h["docs"].to_numpy() / max(1, int(h["docs"].sum()))
        ax.step(np.append(lo, lo[-1] * 2), np.append(share, share[-1]), where="post", label=src)
    if seq_len:
        ax.axvline(seq_len, color="grey", linestyle="--", linewidth=1)
        ax.annotate("S", (seq_len, ax.get_ylim()[1]), ha="left", va="top", color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("document length (tokens, log2 buckets)")
    ax.set_ylabel("share of documents")
    ax.legend(fontsize="small")
    ax.set_title("Document lengths per source")
    return png_markdown(fig, "length histogram per source")


def mixture_area_md(quotas: pl.DataFrame) -> str:
    """Planned share of each source over steps as a stacked area chart (a ``plan_quotas`` frame).

    Phase boundaries are dotted lines labelled with the phase name.
    """
    wide = quotas.pivot(on="source", index=["step", "phase"], values="quota").sort("step")
    sources = sorted(c for c in wide.columns if c not in ("step", "phase"))
    tokens = wide.select(sources).to_numpy().astype(np.float64)
    shares = tokens / np.maximum(tokens.sum(axis=1, keepdims=True), 1)
    steps = wide["step"].to_numpy()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.2))
    ax = fig.subplots()
    # one more edge so the last step gets its full width
    edges = np.append(steps, steps[-1] + 1) if len(steps) else steps
    ax.stackplot(edges, np.vstack([shares, shares[-1:]]).T if len(steps) else shares.T, labels=sources, step="post")
    phases = wide["phase"].to_list()
    for i, name in enumerate(phases):
        if i == 0 or name != phases[i - 1]:
            ax.axvline(steps[i], color="black", linestyle=":", linewidth=1)
            ax.annotate(name, (steps[i], 1.0), xytext=(3, -3), textcoords="offset points", va="top", fontsize=8)
    ax.set_xlim(steps[0] if len(steps) else 0, steps[-1] + 1 if len(steps) else 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("step")
    ax.set_ylabel("planned token share")
    ax.legend(loc="lower left", fontsize="small", ncol=min(4, len(sources)))
    ax.set_title("Planned mixture over steps")
    return png_markdown(fig, "planned mixture over steps")
