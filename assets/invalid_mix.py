"""The stand-in of a mix file that does not load: one asset and one check that show its error in the UI.

Every other mix keeps loading; this one's group (named after the file) holds the asset ``mix_file`` whose
description and definition metadata carry the one-line error (file, line, field), whose materialization
fails with it, and whose check ``mix_file_valid`` fails with it when executed.
"""

from __future__ import annotations

import re
from pathlib import Path

import dagster as dg

from mixing import MixError, load_mix

__all__ = ["invalid_mix_assets", "invalid_mix_group"]


def invalid_mix_group(path: Path, taken: set[str]) -> str:
    """A valid Dagster group name for the broken file ``path``: its stem, made unique among ``taken``."""
    name = re.sub(r"\W", "_", path.stem, flags=re.ASCII) or "mix"
    if not re.match(r"[A-Za-z_]", name):
        name = f"_{name}"
    while name in taken:
        name += "_invalid"
    return name


def invalid_mix_assets(path: Path, group: str, error: str) -> tuple[dg.AssetsDefinition, dg.AssetChecksDefinition]:
    """The placeholder asset ``[group, "mix_file"]`` and its failing check for ``path``, which fails with ``error``."""
    key = dg.AssetKey([group, "mix_file"])

    @dg.asset(
        key=key,
        group_name=group,
        kinds={"yaml"},
        description=f"INVALID MIX FILE — nothing of this mix is built until it is fixed: {error}",
        metadata={"error": error, "mix_file": dg.MetadataValue.path(str(path))},
    )
    def mix_file() -> None:
        try:
            load_mix(path)
        except MixError as e:
            raise MixError(f"{e} (fix the mix file, then reload the code location)") from None
        raise MixError(f"{path}: the file is valid now; reload the code location to build it")

    @dg.asset_check(asset=key, name="mix_file_valid", description="The mix file loads (fails with its error).")
    def mix_file_valid() -> dg.AssetCheckResult:
        try:
            load_mix(path)
        except MixError as e:
            return dg.AssetCheckResult(passed=False, description=str(e), metadata={"error": str(e)})
        return dg.AssetCheckResult(passed=True, description=f"{path} is valid now; reload the code location")

    return mix_file, mix_file_valid
