"""Each document's (chunk, first token) from the sources' document indexes, memory-mapped."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from mixing.pack import locations
from mixing.pack.locations import Locations


def _index(path: Path, rng: np.random.Generator, n: int, tag: str) -> pl.DataFrame:
    """A ``docs.parquet`` with the columns the locations read: chunks in runs, offsets rising in each."""
    run = rng.integers(1, 9, size=n)
    chunk = np.repeat(np.arange(n), run)[:n]
    offset = rng.integers(0, 1 << 40, size=n)
    df = pl.DataFrame({"doc_id": np.arange(n), "chunk": [f"{tag}-{c:04d}" for c in chunk], "offset": offset})
    df.write_parquet(path, row_group_size=7)
    return df


@pytest.mark.parametrize("batch", [1, 5, 1 << 20])
def test_every_document_is_found_where_its_index_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch: int
) -> None:
    monkeypatch.setattr(locations, "_BATCH", batch)  # a chunk's documents split over batches, or not
    rng = np.random.default_rng(batch)
    frames = [_index(tmp_path / f"{s}.parquet", rng, n, f"s{s}") for s, n in enumerate([40, 1, 23])]
    with Locations(tmp_path / "work", [tmp_path / f"{s}.parquet" for s in range(3)]) as where:
        keys = where.chunk_keys
        assert len(set(keys)) == len(keys) == sum(f["chunk"].n_unique() for f in frames)
        m = 500
        src = rng.integers(0, 3, size=m)
        doc = np.array([rng.integers(0, len(frames[s])) for s in src])
        start = rng.integers(0, 5, size=m) * 64
        segs = np.stack([src, doc, start, np.full(m, 64)], axis=1).astype(np.int64)
        chunk, first = where.of(segs)
        for i in range(m):
            row = frames[src[i]].row(int(doc[i]), named=True)
            assert keys[chunk[i]] == (src[i], row["chunk"])
            assert first[i] == row["offset"] + start[i]
    assert not (tmp_path / "work").exists()


def test_a_doc_id_past_the_index_is_an_error_not_a_wrong_chunk(tmp_path: Path) -> None:
    _index(tmp_path / "0.parquet", np.random.default_rng(0), 10, "a")
    with Locations(tmp_path / "work", [tmp_path / "0.parquet"]) as where, pytest.raises(IndexError):
        where.of(np.array([[0, 10, 0, 1]], np.int64))


def test_what_a_killed_build_left_is_replaced(tmp_path: Path) -> None:
    _index(tmp_path / "0.parquet", np.random.default_rng(0), 10, "a")
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "0.npy").write_bytes(b"half a file")
    with Locations(tmp_path / "work", [tmp_path / "0.parquet"]) as where:
        assert where.of(np.array([[0, 9, 0, 1]], np.int64))[0].shape == (1,)
