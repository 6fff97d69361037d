"""The factory of weir: mix files, indexing, tokenizing, statistics, planning, packing and the build's output.

Never imports Dagster or torch; writes a build through the build contract (:mod:`contract`).
"""

from mixing.mixfile.locations import MixError
from mixing.mixfile.mix import Mix, load_mix
from mixing.output.layout import BuildLayout

__all__ = ["BuildLayout", "Mix", "MixError", "load_mix"]
