"""``PackedDataset``: the packed token stream of a weir build as a torch ``IterableDataset``.

Training code imports this (and never Dagster)::

    from loaders import PackedDataset
    ds = PackedDataset("build/demo", dp_rank=rank, dp_size=world)
    for batch in torch.utils.data.DataLoader(ds, batch_size=None): ...
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from mixing.shards import ShardSet

__all__ = ["IGNORE_INDEX", "PackedDataset"]

IGNORE_INDEX = -100


class PackedDataset(IterableDataset[dict[str, Any]]):
    """Yields, in step order, one dict per packed sequence assigned to this DP rank, sliced for this CP rank.

    Each step's ``global_batch`` sequences are shuffled with ``seed`` and dealt to DP ranks round-robin
    (``global_batch`` must be divisible by ``dp_size``); a CP rank gets the contiguous ``S / cp_size``
    slice. Items (torch tensors):

    - ``input_ids`` int64 [S/cp], ``labels`` int64 [S/cp] (next token inside the same document, else -100;
      padding is -100), ``position_ids`` int64 [S/cp] (0-based position inside its document),
    - ``cu_seqlens`` int32 [k+1]: boundaries of the full sequence's k segments (the trailing padding, if
      any, is its own segment, so ``cu_seqlens[-1] == S``),
    - ``step`` and ``sequence`` (global index in the build): Python ints.

    Deterministic for the same build, world and seed. ``state_dict()`` after n items and
    ``load_state_dict()`` on a fresh dataset continue with item n+1. Use ``num_workers=0`` when you rely on
    ``state_dict()``: worker processes hold their own copies of the position.
    """

    def __init__(
        self,
        path: str | Path,
        dp_rank: int = 0,
        dp_size: int = 1,
        cp_rank: int = 0,
        cp_size: int = 1,
        seed: int = 0,
    ) -> None:
        super().__init__()
        root = Path(path)
        self.shards = ShardSet(root / "shards" if (root / "shards" / "manifest.json").exists() else root)
        m = self.shards.manifest
        self.seq_len = int(m["seq_len"])
        self.global_batch = int(m["global_batch"])
        if not (0 <= dp_rank < dp_size and 0 <= cp_rank < cp_size):
            raise ValueError(f"rank out of range: dp {dp_rank}/{dp_size}, cp {cp_rank}/{cp_size}")
        if self.global_batch % dp_size:
            raise ValueError(f"global_batch {self.global_batch} is not divisible by dp_size {dp_size}")
        if self.seq_len % cp_size:
            raise ValueError(f"sequence length {self.seq_len} is not divisible by cp_size {cp_size}")
        self.dp_rank, self.dp_size, self.cp_rank, self.cp_size, self.seed = (
            dp_rank,
            dp_size,
            cp_rank,
            cp_size,
            seed,
        )
        self.build_id = hashlib.sha256((self.shards.dir / "manifest.json").read_bytes()).hexdigest()
        self._next = 0  # index into this rank's sequence list of the next item to yield

    def rank_sequences(self) -> np.ndarray:
        """Global sequence indices this DP rank reads, in order (int64)."""
        steps = self.shards.steps
        out = []
        for step in np.unique(steps):
            idx = np.flatnonzero(steps == step)
            rng = np.random.default_rng([self.seed & 0xFFFFFFFF, int(step)])
            out.append(rng.permutation(idx)[self.dp_rank :: self.dp_size])
        return np.concatenate(out) if out else np.zeros(0, np.int64)

    def __len__(self) -> int:
        return len(self.shards) // self.dp_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        seqs = self.rank_sequences()
        info = get_worker_info()
        start = self._next
        stride, offset = (1, 0) if info is None else (info.num_workers, info.id)
        for k in range(start + offset, len(seqs), stride):
            item = self._item(int(seqs[k]))
            self._next = k + 1
            yield item

    def _item(self, i: int) -> dict[str, Any]:
        view = self.shards.sequence(i)
        tokens = np.asarray(view.tokens, dtype=np.int64)
        lens = view.segments[:, 3]
        used = int(lens.sum())
        seg_lens = np.append(lens, self.seq_len - used) if used < self.seq_len else lens
        cu = np.concatenate([[0], np.cumsum(seg_lens)])
        position_ids = np.arange(self.seq_len) - np.repeat(cu[:-1], seg_lens)
        labels = np.roll(tokens, -1)
        labels[cu[1:] - 1] = IGNORE_INDEX  # the last token of each document predicts nothing
        labels[used:] = IGNORE_INDEX
        lo = self.cp_rank * (self.seq_len // self.cp_size)
        hi = lo + self.seq_len // self.cp_size
        return {
            "input_ids": torch.from_numpy(tokens[lo:hi].copy()),
            "labels": torch.from_numpy(labels[lo:hi].copy()),
            "position_ids": torch.from_numpy(position_ids[lo:hi].copy()),
            "cu_seqlens": torch.from_numpy(cu.astype(np.int32)),
            "step": view.step,
            "sequence": i,
        }

    def state_dict(self) -> dict[str, Any]:
        """Position of this rank's stream: resume with :meth:`load_state_dict` on the same build and world."""
        return {
            "build_id": self.build_id,
            "dp_rank": self.dp_rank,
            "dp_size": self.dp_size,
            "cp_size": self.cp_size,
            "seed": self.seed,
            "next": self._next,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("build_id") != self.build_id:
            raise ValueError(
                "this state comes from another build (build_id differs); resume with the build the run started on"
            )
        mine = {"dp_rank": self.dp_rank, "dp_size": self.dp_size, "cp_size": self.cp_size, "seed": self.seed}
        theirs = {k: state.get(k) for k in mine}
        if mine != theirs:
            raise ValueError(f"state was saved for {theirs}, this dataset is {mine}")
        self._next = int(state["next"])
