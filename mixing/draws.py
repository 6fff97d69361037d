"""The draw order: each source's units (whole documents, or S-token pieces of longer ones) in a seeded order.

A fresh permutation of the source's documents per epoch (numpy PCG64 seeded by the mix seed, crc32 of the
source name and the epoch: stable across numpy versions and machines). The order is loaded into DuckDB as
the temp table ``_units`` for the planner; only the prefix the plan can reach is kept.
"""

from __future__ import annotations

import zlib

import duckdb
import numpy as np
import pyarrow as pa

from mixing.curriculum import PhaseSpan, length_segments
from mixing.mixfile import Mix

__all__ = ["draw_targets", "load_draws"]


Target = tuple[int | None, int]  # (max_doc_tokens or None, tokens the order must hold that it may draw)


def draw_targets(spans: tuple[PhaseSpan, ...], need: dict[tuple[str, str], int], source: str, seq: int) -> list[Target]:
    """Per segment that draws ``source``: (its ``max_doc_tokens`` or None, Σ over it and earlier segments
    of demand + S). A draw order holding that many tokens the segment may draw is enough for it."""
    out: list[Target] = []
    run = 0
    for seg in length_segments(spans):
        want = sum(need.get((sp.name, source), 0) for sp in seg)
        run += want + seq
        if want:
            out.append((seg[0].max_doc_tokens, run))
    return out


def load_draws(
    con: duckdb.DuckDBPyConnection,
    mix: Mix,
    epochs: dict[str, int],
    targets: dict[str, list[Target]],
) -> None:
    """Temp table ``_units``: each source's units in draw order (``ord``), at most ``epochs[source]`` epochs.

    The order is a numpy PCG64 permutation seeded by (seed, crc32(source), epoch): stable across versions.
    Only the prefix of the order that meets every one of the source's ``targets`` is kept (see
    :func:`draw_targets`): the draw never reaches past it, so the plan is the same as over the whole order
    while the work grows with the tokens planned rather than with the corpus.
    """
    seq = mix.sequence.length
    cols: dict[str, list[np.ndarray]] = {
        k: [] for k in ("src", "epoch", "doc_id", "piece", "start", "length", "doc_len", "ord")
    }
    names = sorted(epochs)
    for k, name in enumerate(names):
        if not epochs[name]:
            continue
        docs = con.sql(
            "SELECT doc_id, n_tokens FROM documents WHERE source = ? ORDER BY doc_id", params=[name]
        ).fetchnumpy()
        ids, lens = docs["doc_id"].astype(np.int64), docs["n_tokens"].astype(np.int64)
        pieces = np.maximum(1, -(-lens // seq))
        base = 0
        got = [0] * len(targets[name])  # tokens each target may draw, in the epochs kept so far
        for e in range(epochs[name]):
            rng = np.random.default_rng([mix.seed & 0xFFFFFFFF, zlib.crc32(name.encode()), e])
            perm = rng.permutation(len(ids))
            n_p = pieces[perm]
            rep = np.repeat(perm, n_p)
            first = np.repeat(np.cumsum(n_p) - n_p, n_p)
            piece = np.arange(len(rep), dtype=np.int64) - first
            start = piece * seq
            length = np.minimum(seq, lens[rep] - start)
            doc_len = lens[rep]
            cut = 0
            for t, (limit, want) in enumerate(targets[name]):
                if got[t] >= want:
                    continue  # met in an earlier epoch
                cum = np.cumsum(length if limit is None else np.where(doc_len <= limit, length, 0))
                if len(cum) and got[t] + int(cum[-1]) >= want:
                    cut = max(cut, int(np.searchsorted(cum, want - got[t])) + 1)
                got[t] += int(cum[-1]) if len(cum) else 0
            done = all(g >= w for g, (_lim, w) in zip(got, targets[name], strict=True))
            end = cut if done else len(rep)
            cols["src"].append(np.full(end, k, np.int16))
            cols["epoch"].append(np.full(end, e, np.int32))
            cols["doc_id"].append(ids[rep[:end]])
            cols["piece"].append(piece[:end])
            cols["start"].append(start[:end])
            cols["length"].append(length[:end])
            cols["doc_len"].append(doc_len[:end])
            cols["ord"].append(np.arange(base, base + end, dtype=np.int64))
            base += end
            if done:
                break
    empty = {"src": np.int16, "epoch": np.int32}
    table = pa.table({k: np.concatenate(v) if v else np.zeros(0, empty.get(k, np.int64)) for k, v in cols.items()})
    con.register("_units_in", table)
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _units AS FROM _units_in",
    )
    con.unregister("_units_in")
