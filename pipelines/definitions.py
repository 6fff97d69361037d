"""Dagster definitions: every mix file under ``mixes/`` (or ``$WEIR_MIXES``) becomes an asset group.

Builds go under ``build/`` (or ``$WEIR_BUILD_ROOT``), one folder per mix. Loaded by ``dg dev``,
``dagster dev -w workspace.yaml`` and ``weir ui``.
"""

import os
from pathlib import Path

import dagster as dg

from assets import WeirStorage, mix_assets
from mixing import Mix, load_mix

__all__ = ["defs", "load_definitions", "mix_job"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def mix_job(mix: Mix):  # type: ignore[no-untyped-def]  # dagster's return type is not public
    """The job that builds every asset of ``mix``."""
    return dg.define_asset_job(
        f"build_{mix.name}",
        selection=dg.AssetSelection.groups(mix.name),
        description=f"Build the mix {mix.name!r} end to end: index, tokenize, stats, plan, pack.",
    )


def load_definitions(mixes_dir: Path, build_root: Path) -> dg.Definitions:
    """Definitions for every ``*.yaml`` mix file in ``mixes_dir`` (sorted by name).

    An invalid mix file raises :class:`mixing.MixError` naming file, line and field, so the problem shows
    where the definitions are loaded (the UI's code-location error, ``dg check defs``).
    """
    mixes = [load_mix(p) for p in sorted(mixes_dir.glob("*.yaml"))]
    names = [m.name for m in mixes]
    if len(set(names)) != len(names):
        raise ValueError(f"{mixes_dir}: two mix files declare the same name: {sorted(names)}")
    return dg.Definitions(
        assets=[a for m in mixes for a in mix_assets(m)],
        jobs=[mix_job(m) for m in mixes],
        resources={"storage": WeirStorage(root=str(build_root))},
    )


defs = load_definitions(
    Path(os.environ.get("WEIR_MIXES", PROJECT_ROOT / "mixes")),
    Path(os.environ.get("WEIR_BUILD_ROOT", PROJECT_ROOT / "build")),
)
