"""Megatron-LM indexed dataset export, checked byte by byte against the documented layout."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from contract.shards import ShardSet
from mixing.output.megatron import export_megatron
from mixing.output.shard_writer import token_dtype, write_shards
from tests.mixing.pack.test_packing import _build


def _parse_idx(path: Path) -> dict:
    """Read an .idx by the documented layout only (no shared code with the writer)."""
    raw = path.read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    (version,) = struct.unpack_from("<Q", raw, 9)
    (code,) = struct.unpack_from("<B", raw, 17)
    n_seq, n_doc = struct.unpack_from("<QQ", raw, 18)
    off = 34
    lengths = np.frombuffer(raw, "<i4", n_seq, off)
    off += 4 * n_seq
    pointers = np.frombuffer(raw, "<i8", n_seq, off)
    off += 8 * n_seq
    docs = np.frombuffer(raw, "<i8", n_doc, off)
    off += 8 * n_doc
    assert off == len(raw), "trailing bytes after the document indices"
    return {"version": version, "code": code, "lengths": lengths, "pointers": pointers, "docs": docs}


@pytest.mark.parametrize("unit", ["segment", "sequence"])
def test_export_matches_the_documented_layout(tiny_mix_path: Path, tmp_path: Path, unit: str) -> None:
    layout = _build(tiny_mix_path, tmp_path / "b")
    shards = ShardSet(layout.shards_dir)
    r = export_megatron(shards, tmp_path / "out" / "tiny", unit)  # type: ignore[arg-type]
    idx = _parse_idx(tmp_path / "out" / "tiny.idx")
    assert idx["version"] == 1 and idx["code"] == 8  # bytes tokenizer: uint16
    item = 2
    bin_ = (tmp_path / "out" / "tiny.bin").read_bytes()
    assert len(bin_) == int(idx["lengths"].sum()) * item == r["tokens"] * item
    assert np.array_equal(idx["pointers"], np.concatenate([[0], np.cumsum(idx["lengths"][:-1]) * item]))
    assert idx["docs"][0] == 0 and idx["docs"][-1] == len(idx["lengths"]) and (np.diff(idx["docs"]) >= 0).all()
    assert len(idx["docs"]) == len(shards) + 1
    # the counts in weir's words (sequences: packed sequences, documents: their segments), Megatron's beside them
    segments = len(shards.segments[1])
    assert (r["sequences"], r["documents"], r["unit"]) == (len(shards), segments, unit)
    assert r["megatron"] == {"sequences": len(idx["lengths"]), "documents": len(idx["docs"]) - 1}
    assert r["megatron"]["sequences"] == (segments if unit == "segment" else len(shards))
    assert r["summary"].startswith(f"{r['prefix']}.bin/.idx: {len(shards):,} packed sequences holding {segments:,} ")
    assert f"Megatron's index counts {r['megatron']['sequences']:,} sequences" in r["summary"]
    tokens = np.frombuffer(bin_, "<u2")
    for i in range(len(shards)):
        v = shards.sequence(i)
        seqs = range(idx["docs"][i], idx["docs"][i + 1])
        got = [tokens[idx["pointers"][j] // item :][: idx["lengths"][j]] for j in seqs]
        if unit == "segment":
            assert [len(g) for g in got] == v.segments[:, 3].tolist()
            assert np.array_equal(np.concatenate(got), v.tokens[: v.segments[:, 3].sum()])
        else:
            assert len(got) == 1 and np.array_equal(got[0], v.tokens)


def test_large_vocabularies_export_as_int32(tmp_path: Path) -> None:
    tokens = np.array([[70000, 5, 1, 1], [3, 4, 99999, 1]], dtype=token_dtype(100000))
    offs, segs = np.array([0, 1, 3]), np.array([[0, 0, 0, 2], [0, 1, 0, 2], [0, 2, 0, 1]])
    write_shards(tmp_path / "s", tokens, np.zeros(2, np.int64), offs, segs, 1, {"cost": {}})
    r = export_megatron(ShardSet(tmp_path / "s"), tmp_path / "m")
    assert r["summary"] == (
        f"{tmp_path / 'm'}.bin/.idx: 2 packed sequences holding 3 documents, 5 tokens, padding left out (int32); "
        "Megatron's index counts 3 sequences (one per weir document) in 2 documents (one per packed sequence)"
    )
    idx = _parse_idx(tmp_path / "m.idx")
    assert idx["code"] == 4 and idx["lengths"].tolist() == [2, 2, 1] and idx["docs"].tolist() == [0, 1, 3]
    assert np.frombuffer((tmp_path / "m.bin").read_bytes(), "<i4").tolist() == [70000, 5, 3, 4, 99999]


def test_megatron_core_reads_the_export(tiny_mix_path: Path, tmp_path: Path) -> None:
    """Megatron-Core's own reader, when importable (it is not a dependency of weir).

    Run it with: pip install --no-deps --target /tmp/mcore-site megatron-core==0.16.1, then
    PYTHONPATH=/tmp/mcore-site .venv/bin/python -m pytest tests/mixing/output/test_megatron.py
    """
    pytest.importorskip("megatron.core.datasets.indexed_dataset", reason="megatron-core is not installed")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    layout = _build(tiny_mix_path, tmp_path / "b")
    shards = ShardSet(layout.shards_dir)
    export_megatron(shards, tmp_path / "tiny")
    ds = IndexedDataset(str(tmp_path / "tiny"))
    assert len(ds.document_indices) == len(shards) + 1
    k = 0
    for i in range(len(shards)):
        v = shards.sequence(i)
        pos = 0
        for length in v.segments[:, 3].tolist():
            assert np.array_equal(ds[k], v.tokens[pos : pos + length])
            pos, k = pos + length, k + 1
    assert k == len(ds)
