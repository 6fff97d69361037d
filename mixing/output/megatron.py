"""Export a build's packed shards as a Megatron-LM indexed dataset (``PREFIX.bin`` + ``PREFIX.idx``).

Words. Megatron's indexed dataset calls its entries *sequences* and groups them into *documents*, which is
not what weir calls so. Here, as everywhere in weir, a **document** is one segment of a packed sequence (a
document, or an S-token piece of a longer one) and a **sequence** is a packed sequence of S slots. With
``unit="segment"`` (default) each weir document is one Megatron sequence and each packed sequence is one
Megatron document; with ``unit="sequence"`` each packed sequence, padding included, is one Megatron sequence
and one Megatron document. :func:`export_megatron` returns its counts in weir's words, Megatron's beside them
under ``"megatron"``.

Layout written (Megatron-Core ``IndexedDataset``, index version 1, all integers little-endian; the names in
this list are Megatron's):

``.idx``: ``b"MMIDIDX\\x00\\x00"`` (9 bytes) · version ``<Q`` = 1 · dtype code ``<B`` (8 = uint16,
4 = int32) · Megatron sequence count ``<Q`` · Megatron document count ``<Q`` (= len(document_indices)) ·
sequence lengths int32 [sequences] · sequence pointers int64 [sequences] (byte offsets into ``.bin``) ·
document indices int64 [documents] (the first sequence of each document, starting at 0 and ending with the
sequence count).

``.bin``: the token ids of every Megatron sequence back to back, in that dtype.

With ``unit="segment"`` the Megatron sequences are the weir documents in packed order and
``document_indices`` = the shards' ``seg_offsets``; padding is not exported.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any, Literal

import numpy as np

from contract.atomic import atomic_path
from contract.shards import ShardSet

__all__ = ["DTYPE_CODES", "INDEX_HEADER", "export_megatron", "summary"]

INDEX_HEADER = b"MMIDIDX\x00\x00"
# Megatron-Core's DType enum: numpy dtype -> code stored in the index
_CODES = ("uint8", 1), ("int8", 2), ("int16", 3), ("int32", 4), ("int64", 5), ("float64", 6), ("float32", 7)
DTYPE_CODES = {np.dtype(t): code for t, code in (*_CODES, ("uint16", 8))}


def export_megatron(
    shards: ShardSet, prefix: Path | str, unit: Literal["segment", "sequence"] = "segment"
) -> dict[str, Any]:
    """Write ``prefix.bin`` then ``prefix.idx`` (each atomically; the index last); return what was written.

    Token dtype: uint16 when the build's shards are uint16, else int32 (Megatron has no uint32; ids of
    vocabularies ≤ 2³¹ fit). Deterministic: the same build gives the same bytes.

    The result, in weir's words (the module's docstring): ``prefix``, ``dtype``, ``unit``, ``sequences``
    (packed sequences exported: all of the build's), ``documents`` (weir documents in them, each S-token
    piece of a longer document counted once), ``tokens`` (token ids written to ``.bin``: the real tokens, and
    with ``unit="sequence"`` the padding as well), ``megatron`` (``{"sequences": ..., "documents": ...}``: the
    counts in the ``.idx`` header, Megatron's words) and ``summary``, one line saying all of it, the mapping
    once.
    """
    prefix = Path(prefix)
    dtype = np.dtype(np.uint16) if shards.manifest.dtype == "uint16" else np.dtype(np.int32)
    seq_len = shards.manifest.seq_len
    n = len(shards)
    offs, segs = shards.segments
    if unit == "segment":
        lengths = segs[:, 3].astype(np.int32)
        doc_idx = offs.astype(np.int64)
    else:
        lengths = np.full(n, seq_len, np.int32)
        doc_idx = np.arange(n + 1, dtype=np.int64)
    used = shards.seq_tokens if unit == "segment" else np.full(n, seq_len, np.int64)
    with atomic_path(prefix.with_name(prefix.name + ".bin")) as tmp, tmp.open("wb") as f:
        for k, sh in enumerate(shards.manifest.shards):
            lo, cnt = sh.first_sequence, sh.sequences
            block = np.asarray(shards.shard_tokens(k))  # [cnt, S]
            keep = np.arange(seq_len)[None, :] < used[lo : lo + cnt, None]
            f.write(block[keep].astype(dtype).tobytes())  # row-major: each sequence's real tokens in order
    pointers = np.concatenate([[0], np.cumsum(lengths.astype(np.int64) * dtype.itemsize)[:-1]]).astype(np.int64)
    pointers = pointers[: len(lengths)]
    with atomic_path(prefix.with_name(prefix.name + ".idx")) as tmp, tmp.open("wb") as f:
        f.write(INDEX_HEADER)
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", DTYPE_CODES[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(lengths.astype("<i4").tobytes())
        f.write(pointers.astype("<i8").tobytes())
        f.write(doc_idx.astype("<i8").tobytes())
    megatron = {"sequences": len(lengths), "documents": len(doc_idx) - 1}
    result: dict[str, Any] = {
        "prefix": str(prefix),
        "dtype": str(dtype),
        "unit": unit,
        "sequences": n,
        "documents": len(segs),
        "tokens": int(lengths.astype(np.int64).sum()),
        "megatron": megatron,
    }
    result["summary"] = summary(result)
    return result


def summary(result: dict[str, Any]) -> str:
    """One line for a person: the counts of an :func:`export_megatron` result in weir's words, then once how
    they map to the Megatron words of the ``.idx``."""
    r, m = result, result["megatron"]
    if r["unit"] == "segment":
        mapping = (
            f"Megatron's index counts {m['sequences']:,} sequences (one per weir document) in {m['documents']:,} "
            "documents (one per packed sequence)"
        )
        what = "tokens, padding left out"
    else:
        mapping = (
            f"Megatron's index counts {m['sequences']:,} sequences and {m['documents']:,} documents "
            "(one each per packed sequence)"
        )
        what = "tokens, padding included"
    return (
        f"{r['prefix']}.bin/.idx: {r['sequences']:,} packed sequences holding {r['documents']:,} documents, "
        f"{r['tokens']:,} {what} ({r['dtype']}); {mapping}"
    )
