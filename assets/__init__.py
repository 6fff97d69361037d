"""Thin Dagster assets over :mod:`mixing` and :mod:`loaders`."""

from assets.mix_assets import STAGES, mix_assets
from assets.storage import WeirStorage

__all__ = ["STAGES", "WeirStorage", "mix_assets"]
