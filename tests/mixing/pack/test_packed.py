"""Shards written from the packing as it is made: the same sequences as the packing collected whole."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contract.shards import ShardSet
from mixing.ingest import chunks
from mixing.ingest.documents import open_documents
from mixing.mixfile.mix import load_mix
from mixing.pack import packed
from mixing.pack.packing import pack_plan
from tests.mixing.pack.test_packing import _build


@pytest.mark.parametrize("per_shard", [1, 3, 4, 9])
def test_shards_cut_anywhere_in_a_step_hold_the_packing_and_its_tokens(
    tiny_mix_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, per_shard: int
) -> None:
    monkeypatch.setattr(chunks, "_GROUP", 3)  # several chunks per source: segments gathered from many
    monkeypatch.setattr(packed, "_SHARD_TOKENS", 64 * per_shard)  # S=64, 4 sequences a step
    layout = _build(tiny_mix_path, tmp_path / "b")
    mix = load_mix(tiny_mix_path)
    whole = pack_plan(layout.duckdb, 64, 4, cost=mix.balance.cost.model())
    shards = ShardSet(layout.shards_dir)
    m = shards.manifest
    assert [s.sequences for s in m.shards][:-1] == [per_shard] * (len(m.shards) - 1)
    assert m.sequences == len(whole.seq_step) == 4 * mix.total_steps and m.sequences_per_step == 4
    offs, segs = shards.segments
    assert np.array_equal(offs, whole.seg_offsets) and np.array_equal(segs, whole.segments)
    assert np.array_equal(np.concatenate([shards.shard_meta(k)["step"] for k in range(len(m.shards))]), whole.seq_step)
    assert m.sources is not None and m.per_source is not None
    docs = {name: open_documents(layout.source_dir(name)) for name in m.sources}
    for i in range(len(shards)):
        v, pos = shards.sequence(i), 0
        for src, doc, start, length in v.segments.tolist():
            expect = np.asarray(docs[m.sources[src]].document(doc)[start : start + length])
            assert np.array_equal(np.asarray(v.tokens[pos : pos + length]), expect)
            pos += length
    for k, name in enumerate(m.sources):
        got = m.per_source[name]
        mine, drop = whole.segments[whole.segments[:, 0] == k], whole.dropped[whole.dropped[:, 0] == k]
        assert got.tokens_packed == mine[:, 3].sum() and got.tokens_dropped == drop[:, 3].sum()
        assert got.documents_packed == len(np.unique(mine[:, 1]))
        assert got.documents_dropped == len(np.unique(drop[:, 1]))
        assert got.tokens_planned == got.tokens_packed + got.tokens_dropped
    assert not (layout.root / "locations.tmp").exists()
