"""``loaders.feed``: a local build's ``IndexFeed`` (node index or shards' metadata) and a streamed build's
``ViewFeed`` (verified views through a bounded cache) read any sequences, in any order, into the same
tokens and the same ``SegmentTable`` rows (whole segments and their lengths, real tokens, steps; the
index's ``cu_seqlens`` with the trailing padding as one more segment); ``chunks`` keeps the items' order and
cuts them at ``size`` (and, for a streamed build, where the shard changes, never across); ``feed_for`` picks
the feed by ``streamed``; a damaged shard raises ``CorruptShardError`` before a token of it is copied."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loaders.feed import Feed, IndexFeed, SegmentTable, ViewFeed, feed_for
from loaders.index import open_index
from loaders.integrity import CorruptShardError, VerifiedShardSet, Verifier
from loaders.remote import RemoteShardSet, open_remote
from tests.loaders.segmentations import random_build, segmentations

SHARD_SEQUENCES = 3


def smallest_cache(root: Path) -> int:
    """Bytes of the largest shard: a streamed cache that holds one shard at a time (it evicts at each switch)."""
    m = VerifiedShardSet(root / "shards", None).manifest
    return max(sum(f.bytes for f in sh.files.both()) for sh in m.shards)


def feeds(root: Path, cache: Path) -> dict[str, Feed]:
    """Every way of feeding the build at ``root``: local with the node's index, local on the shards' own
    metadata, and streamed (fsspec's local filesystem standing in for object storage)."""
    indexed = VerifiedShardSet(root / "shards", Verifier(cache / "indexed"))
    assert open_index(indexed, cache / "indexed") is not None and indexed.index is not None
    plain = VerifiedShardSet(root / "shards", Verifier(cache / "plain"))
    streamed, _ = open_remote(str(root), cache / "streamed", smallest_cache(root), None, Verifier(cache / "streamed"))
    out = {"index": feed_for(indexed), "meta": feed_for(plain), "stream": feed_for(streamed)}
    assert isinstance(out["index"], IndexFeed) and isinstance(out["meta"], IndexFeed)
    assert isinstance(out["stream"], ViewFeed)
    return out


def rows(table: SegmentTable, at: np.ndarray) -> list[tuple[list[int], int, int]]:
    """What the table says of each row in ``at``: segment lengths, real tokens, step."""
    return [
        (table.lengths[table.offsets[r] : table.offsets[r + 1]].tolist(), int(table.used[r]), int(table.steps[r]))
        for r in at.tolist()
    ]


def check_read(feed: Feed, idx: np.ndarray, S: int) -> tuple[np.ndarray, list[tuple[list[int], int, int]]]:
    """``feed.read(idx)`` checked against the shards' own sequences; returns its tokens and rows."""
    block = np.full((len(idx), S), -7, dtype=np.int64)
    table, at = feed.read(idx, block)
    assert at.dtype == np.int64 and at.shape == idx.shape
    assert table.offsets.dtype == table.lengths.dtype == table.used.dtype == table.steps.dtype == np.int64
    assert table.segments.dtype == np.int64 and table.segments.shape[1:] == (4,)
    assert np.array_equal(table.segments[:, 3], table.lengths)
    got = rows(table, at)
    for k, i in enumerate(idx.tolist()):
        view = feed.shards.sequence(i)
        assert np.array_equal(block[k], view.tokens.astype(np.int64)), i
        lengths, used, step = got[k]
        assert lengths == view.segments[:, 3].tolist() and used == sum(lengths) <= S and step == view.step
        r = int(at[k])  # the whole segments (source, doc_id, start, length): what the provenance fields read
        assert table.segments[table.offsets[r] : table.offsets[r + 1]].tolist() == view.segments.tolist(), i
    if table.cu is not None:
        cu, starts = table.cu
        assert cu.dtype == np.int32 and starts.dtype == np.int64
        for r, (lengths, used, _) in zip(at.tolist(), got, strict=True):
            want = np.cumsum([0, *lengths, *([S - used] if used < S else [])])
            assert cu[starts[r] : starts[r + 1]].tolist() == want.tolist()
    return block, got


@settings(max_examples=20)
@given(segmentations(), st.integers(0, 9), st.data())
def test_every_feed_reads_the_same_tokens_and_segments(
    seg: tuple[int, list[list[int]]], pad_id: int, data: st.DataObject
) -> None:
    S, seg_lens = seg
    n = len(seg_lens)
    idx = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=2 * n)), dtype=np.int64)  # any order, repeats
    with tempfile.TemporaryDirectory() as tmp:
        root = random_build(Path(tmp) / "build", seg_lens, S, pad_id, SHARD_SEQUENCES, sources=3)
        out = {name: check_read(feed, idx, S) for name, feed in feeds(root, Path(tmp) / "cache").items()}
    (block, got), *others = out.values()
    for other_block, other_got in others:
        assert np.array_equal(block, other_block) and got == other_got


@given(st.lists(st.integers(0, 11), max_size=40).map(sorted), st.integers(1, 7))
@settings(max_examples=30)
def test_chunks_keep_the_order_and_a_streamed_builds_never_cross_a_shard(
    tiny_feeds: dict[str, Feed], seqs: list[int], size: int
) -> None:
    shard_of = lambda i: i // SHARD_SEQUENCES  # noqa: E731 -- the tiny random build's shards
    items = [(t, slot, s) for t, (slot, s) in enumerate(enumerate(seqs))]
    for name, feed in tiny_feeds.items():
        cut = list(feed.chunks(iter(items), size))
        assert [a for c in cut for a in c] == items and all(1 <= len(c) <= size for c in cut), name
        if feed.per_shard:
            assert all(len({shard_of(a[-1]) for a in c}) == 1 for c in cut)
            # as long as allowed: a chunk shorter than size ends its shard's run
            for c, d in itertools.pairwise(cut):
                assert len(c) == size or shard_of(c[-1][-1]) != shard_of(d[0][-1])
        else:
            assert all(len(c) == size for c in cut[:-1])


@pytest.fixture(scope="module")
def tiny_feeds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Feed]:
    base = tmp_path_factory.mktemp("feed")
    root = random_build(base / "build", [[5, 3]] * 12, 16, 0, SHARD_SEQUENCES)
    return feeds(root, base / "cache")


@pytest.mark.parametrize("how", ["local", "streamed"])
def test_a_damaged_shard_stops_the_read_before_a_token_of_it(tmp_path: Path, how: str) -> None:
    S, damaged = 16, 1
    root = random_build(tmp_path / "build", [[4, 4, 8]] * 12, S, 0, SHARD_SEQUENCES)
    bad = root / "shards" / VerifiedShardSet(root / "shards", None).manifest.shards[damaged].files.tokens.name
    data = bytearray(bad.read_bytes())
    data[-1] ^= 1  # one flipped bit in the last token: the header still parses
    bad.write_bytes(bytes(data))
    verifier = Verifier(tmp_path / "cache")
    if how == "local":
        feed = feed_for(VerifiedShardSet(root / "shards", verifier))
    else:
        shards, _ = open_remote(str(root), tmp_path / "cache", 1 << 20, None, verifier)
        assert isinstance(shards, RemoteShardSet)
        feed = feed_for(shards)
    idx = np.arange(12, dtype=np.int64)  # shard 0, then the damaged one, then the rest
    block = np.full((len(idx), S), -7, dtype=np.int64)
    with pytest.raises(CorruptShardError, match="sha256") as err:
        feed.read(idx, block)
    assert "\n" not in str(err.value)
    of_it = slice(damaged * SHARD_SEQUENCES, (damaged + 1) * SHARD_SEQUENCES)
    assert (block[of_it] == -7).all()  # not one token of the damaged shard reached the block
