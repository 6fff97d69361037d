"""The factory of weir: mix files, indexing, tokenizing, statistics, planning, packing and the build's output.

Never imports Dagster or torch; writes a build through the build contract (:mod:`contract`).
"""

from mixing.mixfile.mix import Mix, MixError, load_mix
from mixing.output.layout import BuildLayout

__all__ = ["BuildLayout", "Mix", "MixError", "load_mix"]
