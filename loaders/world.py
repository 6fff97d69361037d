"""The training world: ``dp_size`` × ``cp_size`` ranks, from arguments or from the launcher's environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["World"]


@dataclass(frozen=True)
class World:
    """This process's place in a ``dp_size`` × ``cp_size`` grid. CP ranks of one DP rank are adjacent global
    ranks (global rank = ``dp_rank · cp_size + cp_rank``), as in torchtitan's and Megatron's default meshes."""

    dp_rank: int = 0
    dp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1

    def __post_init__(self) -> None:
        if self.dp_size < 1 or self.cp_size < 1:
            raise ValueError(f"dp_size {self.dp_size} and cp_size {self.cp_size} must be ≥ 1")
        if not (0 <= self.dp_rank < self.dp_size and 0 <= self.cp_rank < self.cp_size):
            raise ValueError(f"rank out of range: dp {self.dp_rank}/{self.dp_size}, cp {self.cp_rank}/{self.cp_size}")

    @classmethod
    def detect(cls, cp_size: int = 1) -> World:
        """From an initialized ``torch.distributed`` group, else ``RANK``/``WORLD_SIZE``, else a single rank."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, size = dist.get_rank(), dist.get_world_size()
        else:
            rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        if size % cp_size:
            raise ValueError(f"world size {size} is not divisible by cp_size {cp_size}")
        return cls(rank // cp_size, size // cp_size, rank % cp_size, cp_size)
