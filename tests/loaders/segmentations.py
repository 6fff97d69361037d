"""Random packed builds for the loader tests: any segmentation of sequences, written as real shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from mixing.output.shard_writer import write_shards

__all__ = ["random_build", "segmentations"]


def random_build(
    root: Path, seg_lens: list[list[int]], S: int, pad_id: int, shard_sequences: int, sources: int = 0
) -> Path:
    """A build of ``len(seg_lens)`` sequences (4 per step) whose segments have the given lengths (≤ S in all;
    an empty list is a sequence of padding only). Each segment is (source 0, doc_id = its index in its
    sequence, start 0), unless ``sources`` > 0: then source, doc_id and start are drawn (sources named
    ``s0``, ``s1``, …)."""
    n = len(seg_lens)
    rng = np.random.default_rng(n * S)
    tokens = rng.integers(0, 60000, (n, S)).astype(np.uint32)
    segments = np.array([(0, d, 0, ln) for lens in seg_lens for d, ln in enumerate(lens)], np.int64).reshape(-1, 4)
    offsets = np.concatenate([[0], np.cumsum([len(lens) for lens in seg_lens])]).astype(np.int64)
    manifest: dict = {"global_batch": 4, "pad_id": pad_id, "cost": {"attention": 1.0, "linear": 0.0}}
    if sources:
        m = len(segments)
        segments[:, 0] = rng.integers(0, sources, m)
        segments[:, 1] = rng.integers(0, 10**12, m)
        segments[:, 2] = rng.integers(0, 10**6, m)
        manifest["sources"] = [f"s{k}" for k in range(sources)]
    write_shards(root / "shards", tokens, np.arange(n) // 4, offsets, segments, shard_sequences, manifest)
    return root


@st.composite
def segmentations(draw: st.DrawFn) -> tuple[int, list[list[int]]]:
    # mostly divisible by 2·cp for cp ≤ 4 (every split applies); sometimes not (the per-document zigzag only)
    S = 24 * draw(st.integers(1, 4)) + draw(st.sampled_from([0, 0, 1, 7]))
    out = []
    for _ in range(draw(st.sampled_from([4, 8]))):
        lens, total = [], 0
        for ln in draw(st.lists(st.integers(1, S), min_size=0, max_size=10)):
            ln = min(ln, S - total)
            if ln == 0:
                break
            lens.append(ln)
            total += ln
        out.append(lens)
    return S, out
