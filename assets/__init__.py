"""Thin Dagster assets over :mod:`mixing` and :mod:`loaders`."""

from assets.engine import WeirEngine
from assets.mix_assets import mix_assets
from assets.storage import WeirStorage

__all__ = ["WeirEngine", "WeirStorage", "mix_assets"]
