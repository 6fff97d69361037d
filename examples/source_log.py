"""The loss per source of a training run: summed every step over all ranks, logged, and plotted at the end.

Used by ``train_torch.py`` and ``train_hf.py`` (imported as a sibling module: run them as scripts). The items
carry ``source_ids`` (``Payload(fields=(..., "source_ids"))``), and each micro-batch's per-token losses go
through :func:`loaders.provenance.loss_per_source`; at the end of each optimizer step the sums are
all-reduced over the ranks (:func:`loaders.provenance.reduce_per_source`) and rank 0 appends the step's rows.

The log, ``loss_per_source.csv`` in the run's folder (the format a feedback build reads):

- a header row ``step,source,loss_sum,tokens``, then one row per (step, source) whose ``tokens`` > 0, in
  step order, sources in the build's source order;
- ``step`` (int): the training step, 0-based, as the loader hands it out (``loaders.Step.step``, the
  ``step`` of ``losses.jsonl``);
- ``source`` (str): the source's name (``ds.facts.sources``, the mix file's names);
- ``loss_sum`` (float, nats, written to round-trip a float64): the sum of the per-token cross-entropy over
  the step's targets whose token came from that source, all ranks together;
- ``tokens`` (int): those targets (labels that are not -100); summed over a step's rows, the step's
  targets (``Step.num_targets`` summed over the DP ranks). The source's mean loss is ``loss_sum / tokens``;
  a source's mean over several steps is the ratio of the sums, not the mean of the ratios.

A run that starts (or resumes) at step N first drops the log's rows of steps ≥ N (a run killed after its
last checkpoint logged steps that the resumed run trains again), so every (step, source) is there once.
The plot (``loss_per_source.png``, matplotlib's Agg canvas, no display needed) draws each source's mean
loss per step.
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist

from loaders.provenance import loss_per_source, reduce_per_source

__all__ = ["COLUMNS", "SourceLossLog", "plot_source_losses", "read_rows"]

COLUMNS = ("step", "source", "loss_sum", "tokens")
LOG_NAME, PLOT_NAME = "loss_per_source.csv", "loss_per_source.png"


class SourceLossLog:
    """Per-source loss sums of one optimizer step at a time (:meth:`add` per micro-batch, :meth:`end_step` per
    step, on every rank), written by the rank given ``path`` to the CSV of the module's docstring.

    ``sources``: the build's source names in index order (``ds.facts.sources``). ``path``: the log to append
    to (rank 0), None on the other ranks. Sums stay on the losses' device until :meth:`end_step`."""

    def __init__(self, sources: Sequence[str], path: Path | None) -> None:
        self.sources, self.path = tuple(sources), path
        self._step: int | None = None
        self._sums: tuple[torch.Tensor, torch.Tensor] | None = None
        self._started = False

    def add(self, step: int, losses: torch.Tensor, labels: torch.Tensor, source_ids: torch.Tensor) -> None:
        """Add one micro-batch of training ``step``: per-token ``losses`` (floating, any shape), its
        ``labels`` and ``source_ids`` of the same shape (see :func:`loaders.provenance.loss_per_source`).
        ``ValueError`` for a micro-batch of another step than the ones added since the last :meth:`end_step`."""
        if self._step is not None and step != self._step:
            raise ValueError(f"a micro-batch of step {step} added to step {self._step}; call end_step() between")
        loss_sum, tokens = loss_per_source(losses.detach(), labels, source_ids, len(self.sources))
        if self._sums is not None:
            loss_sum, tokens = loss_sum + self._sums[0], tokens + self._sums[1]
        self._step, self._sums = step, (loss_sum, tokens)

    def end_step(self, group: dist.ProcessGroup | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Close the step: all-reduce its sums over ``group`` (default: every rank; nothing to reduce when
        torch.distributed is not initialized), append its rows to the log (rank with a ``path``) and return
        ``(loss_sum float64 [n], tokens int64 [n])`` of all ranks; None when nothing was added. Every rank of
        the group must call it at every step, after the same number of steps."""
        if self._sums is None or self._step is None:
            return None
        loss_sum, tokens = self._sums
        if dist.is_available() and dist.is_initialized():
            reduce_per_source(loss_sum, tokens, group)
        if self.path is not None:
            self._write(self._step, loss_sum.tolist(), tokens.tolist())
        self._step, self._sums = None, None
        return loss_sum, tokens

    def _write(self, step: int, loss_sum: list[float], tokens: list[int]) -> None:
        assert self.path is not None
        if not self._started:  # the first step of this run: rows of this step and later are a killed run's
            kept = [r for r in read_rows(self.path) if int(r["step"]) < step] if self.path.exists() else []
            tmp = self.path.with_suffix(".tmp")
            with tmp.open("w", newline="") as f:
                w = csv.writer(f)
                w.writerow(COLUMNS)
                w.writerows([r[c] for c in COLUMNS] for r in kept)
            os.replace(tmp, self.path)
            self._started = True
        with self.path.open("a", newline="") as f:
            w = csv.writer(f)
            for name, s, k in zip(self.sources, loss_sum, tokens, strict=True):
                if k > 0:
                    w.writerow((step, name, repr(float(s)), int(k)))


def read_rows(path: Path) -> list[dict[str, str]]:
    """The rows of a log of this format, as strings keyed by :data:`COLUMNS`."""
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def plot_source_losses(log: Path, png: Path) -> Path | None:
    """Draw each source's mean loss (``loss_sum / tokens``) per step of ``log`` into ``png`` (matplotlib's Agg
    canvas); returns ``png``, or None, saying so on stderr, when matplotlib is not installed (a training node
    may lack it: the log is the record, the plot a convenience) or the log has no rows."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        print(f"matplotlib is not installed: no plot of {log}", file=sys.stderr)
        return None
    rows = read_rows(log) if log.exists() else []
    if not rows:
        print(f"{log} has no rows: no plot", file=sys.stderr)
        return None
    series: dict[str, tuple[list[int], list[float]]] = {}
    for r in rows:
        steps, means = series.setdefault(r["source"], ([], []))
        steps.append(int(r["step"]))
        means.append(float(r["loss_sum"]) / int(r["tokens"]))
    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for name, (steps, means) in series.items():
        ax.plot(steps, means, label=name, marker="." if len(steps) < 50 else None)
    ax.set_xlabel("training step")
    ax.set_ylabel("mean loss per target token (nats)")
    ax.set_title("loss per source")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(png)
    return png
