"""The trainer's stream of a finished build judged against its plan: :mod:`loaders.stream`'s tokens per
source of every training step under the mix file's ``balance.regroup``, measured with
:func:`mixing.plan.mixture.compositions_mixture_error` against the plan's quotas. What ``weir inspect``, the
build summary and the ``packed_shards`` Dagster check show beside the build's own ``mixture_error``."""

from __future__ import annotations

from pathlib import Path

from loaders.stream import stream_compositions, stream_planner
from mixing.output.layout import BuildLayout
from mixing.plan.mixture import compositions_mixture_error, largest_sequence
from mixing.report import StreamMixtureReport, build_quotas

__all__ = ["stream_report"]


def stream_report(root: str | Path | BuildLayout) -> StreamMixtureReport:
    """``mixture_error`` of the trainer's stream of the finished build at ``root`` under its manifest's
    ``regroup``: the keys of :func:`mixing.report.inspect_build`'s ``mixture_error`` plus ``regroup``
    (the window, period and slack it was measured with)."""
    layout = BuildLayout.of(root if isinstance(root, BuildLayout) else Path(root))
    shards = layout.shard_set()
    quotas = build_quotas(layout, bool(shards.manifest.lineage))
    steps = stream_compositions(stream_planner(shards))
    me = compositions_mixture_error(steps, list(shards.manifest.sources or ()), quotas, unit=largest_sequence(shards))
    return StreamMixtureReport(**dict(me.report()), regroup=shards.manifest.regrouping)
