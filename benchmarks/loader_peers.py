"""Peers for ``benchmarks/loader.py``, run by the python of a separate venv (litdata, megatron-core).

Writes the same packed sequences (one row of S tokens each, read straight from the shards' token ``.npy``
files, which ``benchmarks/loader.py`` names in order from the build's manifest) in each peer's format under
``argv[1]``, then reads them back as int64 torch tensors and prints ``PEER<TAB>name<TAB>tokens_per_s`` (best
of ``argv[2]`` passes after a warm-up pass). Needs numpy and torch only (no weir package).

    PEER_PYTHON benchmarks/loader_peers.py WORK_DIR REPEAT TOKEN_FILE...
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch


def rows(files: list[Path]) -> np.ndarray:
    return np.concatenate([np.load(f) for f in files])


def best(fn, repeat: int, min_s: float = 0.5) -> float:
    """As ``benchmarks/loader.py``'s ``timed``: best of ``repeat`` samples of at least ``min_s`` seconds."""
    fn()
    out = 0.0
    for _ in range(repeat):
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < min_s:
            n += fn()
        out = max(out, n / elapsed)
    return out


def _litdata_item(item: tuple[str, int]) -> torch.Tensor:
    """One packed row as int32 (runs in LitData's worker processes: reads the shard by memory map)."""
    path, row = item
    return torch.from_numpy(np.load(path, mmap_mode="r")[row].astype(np.int32))


def litdata(work: Path, repeat: int) -> float:
    from litdata import StreamingDataset, optimize
    from litdata.streaming.item_loader import TokensLoader

    out = work / "litdata"
    seq_len = ROWS.shape[1]
    inputs = [(str(f), r) for f in TOKEN_FILES for r in range(len(np.load(f, mmap_mode="r")))]
    optimize(
        fn=_litdata_item,
        inputs=inputs,
        output_dir=str(out),
        chunk_size=seq_len * 256,
        item_loader=TokensLoader(),
        num_workers=1,
        verbose=False,
    )

    def read() -> int:
        ds = StreamingDataset(str(out), item_loader=TokensLoader(block_size=seq_len), cache_dir=str(work / "ldc"))
        return sum(int(ds[i].to(torch.int64).numel()) for i in range(len(ds)))

    return best(read, repeat)


def megatron(work: Path, repeat: int) -> float:
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder

    prefix = str(work / "mcore")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=ROWS.dtype.type)
    for r in ROWS:
        builder.add_item(torch.from_numpy(r.astype(np.int64)))
        builder.end_document()
    builder.finalize(prefix + ".idx")

    def read() -> int:
        ds = IndexedDataset(prefix)
        return sum(int(torch.from_numpy(ds[i].astype(np.int64)).numel()) for i in range(len(ds)))

    return best(read, repeat)


if __name__ == "__main__":
    import warnings

    warnings.filterwarnings("ignore")
    work, repeat = Path(sys.argv[1]), int(sys.argv[2])
    TOKEN_FILES = [Path(a) for a in sys.argv[3:]]
    ROWS = rows(TOKEN_FILES)
    for name, fn in (("LitData StreamingDataset+TokensLoader", litdata), ("megatron-core IndexedDataset", megatron)):
        try:
            print(f"PEER\t{name}\t{fn(work, repeat)}", flush=True)
        except Exception as e:  # report and go on with the next peer
            print(f"{name} failed: {type(e).__name__}: {e}", file=sys.stderr)
