"""Materialize a mix's assets in-process, stage by stage (what ``weir build`` runs)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import dagster as dg

from assets import WeirStorage, mix_assets
from assets.checks import mix_checks
from mixing import Mix

__all__ = ["build_mix"]


def build_mix(
    mix: Mix, out: Path, say: Callable[[str], None] = print, instance: dg.DagsterInstance | None = None
) -> None:
    """Build ``mix`` into ``out`` by materializing its assets and checks: each source partition, then the rest.

    Materializations are recorded in ``instance`` (default: a throwaway one; pass the UI's to see the build
    there). Raises ``dagster.DagsterExecutionStepExecutionError`` (wrapping the stage's own error) on failure.
    """
    assets = mix_assets(mix)
    defs = [*assets, *mix_checks(mix, assets)]
    resources = {"storage": WeirStorage(root=str(out), per_mix=False)}
    instance = instance or dg.DagsterInstance.ephemeral()
    quiet = {"loggers": {"console": {"config": {"log_level": "CRITICAL"}}}}

    def run(stage: str, partition: str | None = None) -> None:
        say(f"  {stage}" + (f" [{partition}]" if partition else ""))
        dg.materialize(
            defs,
            selection=[dg.AssetKey([mix.name, stage])],
            partition_key=partition,
            resources=resources,
            instance=instance,
            run_config=quiet,
        )

    for stage in ("source_index", "tokenizer", "documents", "length_stats", "plan", "packed_shards"):
        if stage in ("source_index", "documents"):
            for name in sorted(mix.sources):
                run(stage, name)
        else:
            run(stage)
