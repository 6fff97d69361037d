"""Run by ``torchrun --nproc-per-node 4`` from test_distributed.py: dp=2 × cp=2 ranks on gloo (CPU).

Each rank reads its share (world from torch.distributed), all ranks gather ``(step, sequence, indices,
input_ids)``; rank 0 checks that every step reassembles exactly the build's step and writes "ok" or the
first problem to ``argv[2]``. Each rank also stops after two steps, saves, resumes in a fresh dataset and
checks the result is its uninterrupted stream, bit for bit.
"""

from __future__ import annotations

import sys
from collections import defaultdict

import numpy as np
import torch.distributed as dist

from contract.shards import ShardSet
from loaders import Balance, PackedDataset, World


def main(build: str, out: str) -> None:
    dist.init_process_group("gloo")
    ds = PackedDataset(build, world=World.detect(cp_size=2), balance=Balance(seed=9))
    mine = [(it["step"], it["sequence"], it["indices"].numpy(), it["input_ids"].numpy()) for it in ds]
    # stop at a step boundary, save, and resume in a fresh dataset: the same stream, bit for bit
    first = PackedDataset(build, world=World.detect(cp_size=2), balance=Balance(seed=9))
    head = [it for _, it in zip(range(2 * first.per_rank), first, strict=False)]
    again = PackedDataset(build, world=World.detect(cp_size=2), balance=Balance(seed=9))
    again.load_state_dict(first.state_dict())
    resumed = [
        (it["step"], it["sequence"], it["indices"].numpy(), it["input_ids"].numpy()) for it in head + list(again)
    ]
    same = len(resumed) == len(mine) and all(
        a[:2] == b[:2] and np.array_equal(a[2], b[2]) and np.array_equal(a[3], b[3])
        for a, b in zip(resumed, mine, strict=True)
    )
    # regrouped and refined (window 2, period 2): every rank plans alone, and the plans must agree
    regrouped = PackedDataset(build, world=World.detect(cp_size=2), balance=Balance(seed=9, window=2, period=2))
    steps_of = [(it["step"], it["sequence"]) for it in regrouped]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (ds.world, mine, same, steps_of))
    if dist.get_rank() == 0:
        worlds = {(w.dp_rank, w.cp_rank) for w, *_ in gathered}
        problems = [] if worlds == {(0, 0), (0, 1), (1, 0), (1, 1)} else [f"ranks cover {sorted(worlds)}"]
        problems += [f"rank {w}: the resumed stream differs" for w, _, ok, _ in gathered if not ok]
        by_cp: dict[int, list] = defaultdict(list)  # CP ranks of one DP rank read the same sequences
        for w, _, _, pairs in gathered:
            by_cp[w.cp_rank].append(sorted(pairs))
        if sorted(by_cp[0]) != sorted(by_cp[1]):
            problems.append("regrouped: CP ranks of a DP rank read different sequences")
        union = [pair for w, _, _, pairs in gathered if w.cp_rank == 0 for pair in pairs]
        sizes: defaultdict[int, int] = defaultdict(int)
        for step, _ in union:
            sizes[step] += 1
        if sorted(seq for _, seq in union) != list(range(len(ShardSet(ds.shards.dir)))):
            problems.append("regrouped: DP ranks do not read every sequence exactly once")
        elif set(sizes.values()) != {ds.facts.global_batch}:
            problems.append(f"regrouped: training steps of {sorted(set(sizes.values()))} sequences")
        shards = ShardSet(ds.shards.dir)
        rebuilt: dict[int, np.ndarray] = {}
        filled: dict[int, np.ndarray] = {}
        per_step: dict[int, set] = defaultdict(set)
        for _, items, _, _ in gathered:
            for step, seq, idx, ids in items:
                per_step[step].add(seq)
                buf = rebuilt.setdefault(seq, np.full(ds.facts.seq_len, -1, np.int64))
                hits = filled.setdefault(seq, np.zeros(ds.facts.seq_len, np.int64))
                ok = idx >= 0
                buf[idx[ok]] = ids[ok]
                np.add.at(hits, idx[ok], 1)
        for step in range(int(shards.steps.max()) + 1):
            want = set(np.flatnonzero(shards.steps == step).tolist())
            if per_step[step] != want:
                problems.append(f"step {step}: sequences {sorted(per_step[step])} != {sorted(want)}")
        for seq, buf in rebuilt.items():
            if (filled[seq] != 1).any():
                problems.append(f"sequence {seq}: some token read {filled[seq].max()} or 0 times")
            elif not np.array_equal(buf, shards.sequence(seq).tokens.astype(np.int64)):
                problems.append(f"sequence {seq}: tokens differ from the build")
        with open(out, "w") as f:
            f.write("ok" if not problems else problems[0])
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
