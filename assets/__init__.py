"""Thin Dagster assets over :mod:`mixing` and :mod:`loaders`."""

from assets.mix_assets import mix_assets
from assets.storage import WeirStorage

__all__ = ["WeirStorage", "mix_assets"]
