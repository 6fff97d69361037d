"""The loss per source on a GPU: what it costs beside the cross-entropy it follows, that it never waits for the
host, and that it equals the sums computed in float64 on the CPU.

A synthetic step of packed sequences (no build needed): ``--rows`` sequences of ``--seq-len`` tokens, documents
of log-normal lengths (median 600 tokens) from ``--sources`` sources, each sequence's tail padding; per-token
losses from ``cross_entropy(reduction="none")`` over float32 logits of a ``--vocab`` vocabulary, as a trainer
computes them. Timed with CUDA events (median of ``--repeat`` after warm-up), each against the cross-entropy:

- ``loss_per_source``: the sums per source from the item's ``source_ids`` (:mod:`loaders.provenance`);
- ``slot_sources``: the expansion of the items' ``segments`` source column to every slot on the device (what a
  trainer that asks for ``segments`` only calls), and the same ``repeat_interleave`` without its ``output_size``.

Under ``torch.cuda.set_sync_debug_mode("error")`` every one of them is run once: one that synchronizes with the
host (a trainer's step then waits for the GPU to drain) raises there and is reported as such. Needs a CUDA GPU;
without one it says so in one line and exits 2.

    python benchmarks/provenance_gpu.py [--rows 4] [--seq-len 8192] [--vocab 128256] [--sources 8] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's packages: run as a script, only this folder is on the path

import argparse
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from loaders.fields import IGNORE_INDEX
from loaders.provenance import loss_per_source, slot_sources


def step_of(rows: int, seq_len: int, sources: int, vocab: int, seed: int) -> dict[str, np.ndarray]:
    """A step's packed sequences as the loader's items give them, flattened: ``segments`` int64 [k, 3] (a row of
    -1 for each sequence's padding), ``lengths`` int64 [k] (each segment's slots), ``source_ids`` int32 [T],
    ``labels`` int64 [T] (below ``vocab``; -100 at each document's last token and on padding)."""
    rng = np.random.default_rng(seed)
    segs, lengths = [], []
    for _ in range(rows):
        left = seq_len
        while left > 0:
            n = int(min(left, max(2, rng.lognormal(np.log(600), 1.0))))
            tail = n == left and n < 64  # what no document filled: the sequence's padding
            segs.append((-1, -1, -1) if tail else (int(rng.integers(sources)), int(rng.integers(1 << 40)), 0))
            lengths.append(n)
            left -= n
    seg, length = np.array(segs, np.int64), np.array(lengths, np.int64)
    source_ids = np.repeat(seg[:, 0], length).astype(np.int32)
    T = rows * seq_len
    labels = rng.integers(0, vocab, T).astype(np.int64)
    labels[np.cumsum(length) - 1] = IGNORE_INDEX  # a document's last token predicts nothing
    labels[source_ids < 0] = IGNORE_INDEX
    return {"segments": seg, "lengths": length, "source_ids": source_ids, "labels": labels}


def cuda_ms(fn: Callable[[], Any], repeat: int) -> float:
    """Median milliseconds of ``fn`` on the current stream, by CUDA events, after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return float(np.median(times))


def syncs(fn: Callable[[], Any]) -> bool:
    """Whether ``fn`` synchronizes with the host (torch's sync debug mode raises on it)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
    except RuntimeError as e:
        if "synchroniz" not in str(e):
            raise
        return True
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--sources", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("benchmarks/provenance_gpu.py needs a CUDA GPU and this machine has none", file=sys.stderr)
        sys.exit(2)
    dev = torch.device("cuda")
    host = step_of(args.rows, args.seq_len, args.sources, args.vocab, args.seed)
    T = args.rows * args.seq_len
    labels = torch.from_numpy(host["labels"]).to(dev)
    source_ids = torch.from_numpy(host["source_ids"]).to(dev)
    segments = torch.from_numpy(host["segments"]).to(dev)
    lengths = torch.from_numpy(host["lengths"]).to(dev)
    cu = torch.from_numpy(np.concatenate([[0], np.cumsum(host["lengths"])]).astype(np.int32)).to(dev)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    logits = torch.randn(T, args.vocab, device=dev, dtype=torch.float32, generator=gen)
    losses = F.cross_entropy(logits, labels.clamp(min=0), reduction="none")  # a real position's loss

    def per_source() -> tuple[torch.Tensor, torch.Tensor]:
        return loss_per_source(losses, labels, source_ids, args.sources)

    def expand_sized() -> torch.Tensor:
        return slot_sources(segments, cu, T)

    def expand() -> torch.Tensor:
        return torch.repeat_interleave(segments[:, 0], lengths)

    # equal to float64 on the CPU, and the expansion equal to the items' source_ids
    loss_sum, tokens = per_source()
    keep = (host["labels"] != IGNORE_INDEX) & (host["source_ids"] >= 0)
    cpu_losses = losses.double().cpu().numpy()
    want_sum = np.bincount(host["source_ids"][keep], weights=cpu_losses[keep], minlength=args.sources)
    want_tokens = np.bincount(host["source_ids"][keep], minlength=args.sources)
    rel = float(np.max(np.abs(loss_sum.cpu().numpy() - want_sum) / np.maximum(np.abs(want_sum), 1e-30)))
    exact_tokens = bool(np.array_equal(tokens.cpu().numpy(), want_tokens))
    expands = bool(torch.equal(expand_sized(), source_ids.long()))

    ce_ms = cuda_ms(lambda: F.cross_entropy(logits, labels.clamp(min=0), reduction="none"), args.repeat)
    rows = {
        "loss_per_source": (cuda_ms(per_source, args.repeat), syncs(per_source)),
        "slot_sources (segments expanded)": (cuda_ms(expand_sized, args.repeat), syncs(expand_sized)),
        "repeat_interleave, no output_size": (cuda_ms(expand, args.repeat), syncs(expand)),
    }
    out = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "tokens": T,
        "vocab": args.vocab,
        "sources": args.sources,
        "segments": len(host["lengths"]),
        "cross_entropy_ms": ce_ms,
        "loss_sum_max_rel_error": rel,
        "tokens_exact": exact_tokens,
        "expansion_equals_source_ids": expands,
        "rows": {k: {"ms": ms, "of_cross_entropy": ms / ce_ms, "syncs_with_host": s} for k, (ms, s) in rows.items()},
        "load_average": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(out))
        return
    print(
        f"{out['device']}, torch {out['torch']}; {T} tokens ({args.rows} × {args.seq_len}), vocab {args.vocab}, "
        f"{args.sources} sources, {out['segments']} segments; load average {out['load_average']}"
    )
    print(f"cross_entropy(reduction='none') over float32 logits: {ce_ms:.3f} ms")
    print(f"  {'':34} {'ms':>8} {'÷ cross-entropy':>16} {'syncs with the host':>20}")
    for k, (ms, s) in rows.items():
        print(f"  {k:34} {ms:8.4f} {ms / ce_ms:16.5f} {'yes' if s else 'no':>20}")
    print(
        f"loss sums vs float64 on the CPU: max relative error {rel:.2e}; tokens exact: {exact_tokens}; "
        f"the expansion equals source_ids: {expands}"
    )


if __name__ == "__main__":
    main()
