"""Run by ``torchrun --nproc-per-node 2`` from test_provenance.py: two ranks on gloo (CPU).

Each rank reads its share of the whole build twice, as cp=2 (the two ranks are one DP rank's CP ranks) and as
dp=2, sums ``loss_per_source`` of every item and all-reduces it with ``reduce_per_source``; rank 0 checks
that both equal what one rank computes alone over whole sequences, and that the token counts are the build's
targets per source (each document piece's tokens but its last), then writes "ok" or the first problem to
``argv[2]``.
"""

from __future__ import annotations

import sys

import numpy as np
import torch
import torch.distributed as dist

from loaders import PackedDataset, Payload, World
from loaders.provenance import loss_per_source, reduce_per_source


def fake_losses(item: dict) -> torch.Tensor:
    """The token's and its label's function, on a 1/8 grid (exact float64 sums): as test_provenance's."""
    return ((item["input_ids"] * 31 + item["labels"].clamp(min=0) * 7) % 97).to(torch.float32) / 8


def run_sums(ds: PackedDataset) -> tuple[torch.Tensor, torch.Tensor]:
    n = len(ds.facts.sources)
    loss_sum, tokens = torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.int64)
    for it in ds:
        s, k = loss_per_source(fake_losses(it), it["labels"], it["source_ids"], n)
        loss_sum += s
        tokens += k
    return loss_sum, tokens


def main(build: str, out: str) -> None:
    dist.init_process_group("gloo")
    payload = Payload(fields=("input_ids", "labels", "source_ids"))
    got = {}
    for cp in (2, 1):  # 2 ranks: cp 2 × dp 1, then dp 2 × cp 1
        got[cp] = reduce_per_source(*run_sums(PackedDataset(build, world=World.detect(cp_size=cp), payload=payload)))
    if dist.get_rank() == 0:
        alone = PackedDataset(build, world=World(0, 1), payload=payload)
        want = run_sums(alone)
        segs = alone.shards.segments[1]
        pieces = np.bincount(segs[:, 0], minlength=len(alone.facts.sources))
        targets = np.bincount(segs[:, 0], weights=segs[:, 3], minlength=len(pieces)).astype(np.int64) - pieces
        problems = [] if np.array_equal(want[1].numpy(), targets) else [f"one rank: targets {want[1]} != {targets}"]
        for cp, (loss_sum, tokens) in got.items():
            if not (torch.equal(loss_sum, want[0]) and torch.equal(tokens, want[1])):
                problems.append(f"cp {cp}: all-reduced {loss_sum.tolist()}, {tokens.tolist()} != one rank's {want}")
        with open(out, "w") as f:
            f.write("ok" if not problems else problems[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
