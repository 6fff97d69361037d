"""The pure core of weir: mix files, indexing, tokenizing, statistics, planning and packing.

Never imports Dagster or torch.
"""

from mixing.errors import WeirError
from mixing.format.layout import BuildLayout
from mixing.spec.mixfile import Mix, MixError, load_mix

__all__ = ["BuildLayout", "Mix", "MixError", "WeirError", "load_mix"]
