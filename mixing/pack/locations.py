"""Where each packed document's tokens are: the sources' document indexes as memory-mapped local tables.

A shard job needs, for every segment it packs, the chunk that holds its document's tokens and the
document's first token in that chunk. A source's ``docs.parquet`` lists them (``chunk`` key and
``offset``), one row per ``doc_id``, which is the row number. Held as arrays in the driver that is 16 bytes
per document (32 GB at two billion); here each source's pairs are written once, one row group at a time,
into a local ``.npy`` file of int64 [n, 2] (the chunk's number in :attr:`Locations.chunk_keys`, the offset)
that is then memory-mapped for reading. The driver's own memory is one row group and the chunk keys; the
pages that lookups touch belong to the file, and the kernel keeps or drops them as memory allows.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow.parquet as pq

__all__ = ["Locations"]

_BATCH = 1 << 16  # index rows read at a time: ~5 MB of Arrow (its chunk keys are strings), mapped once per batch


class Locations:
    """Each document's (chunk, first token) for the sources ``index_files`` (their ``docs.parquet``, in the
    packing's source order; None for a source with none), in memory-mapped files under ``folder`` (made
    afresh; removed by :meth:`close`).

    ``chunk_keys``: global chunk number → (source index, chunk key), numbered in index order.
    """

    def __init__(self, folder: Path, index_files: Sequence[Path | None]) -> None:
        shutil.rmtree(folder, ignore_errors=True)  # what a killed build left
        folder.mkdir(parents=True)
        self.folder = folder
        keys: list[tuple[int, str]] = []
        self._tables: list[np.ndarray] = []
        for s, path in enumerate(index_files):
            if path is None:  # a source with no documents here (a continuation's removed source)
                self._tables.append(np.zeros((0, 2), np.int64))
                continue
            f = pq.ParquetFile(path)
            out = np.lib.format.open_memmap(folder / f"{s}.npy", "w+", np.int64, (f.metadata.num_rows, 2))
            ids: dict[str, int] = {}
            at = 0
            for batch in f.iter_batches(columns=["chunk", "offset"], batch_size=_BATCH):
                chunk = batch.column(0).dictionary_encode()  # a batch holds a few chunks: map each key once
                for key in chunk.dictionary.to_pylist():
                    if key not in ids:
                        ids[key] = len(keys)
                        keys.append((s, key))
                number = np.array([ids[k] for k in chunk.dictionary.to_pylist()], np.int64)
                n = batch.num_rows
                out[at : at + n, 0] = number[chunk.indices.to_numpy(zero_copy_only=False)]
                out[at : at + n, 1] = batch.column(1).to_numpy(zero_copy_only=False)
                at += n
            out.flush()
            del out
            self._tables.append(np.load(folder / f"{s}.npy", mmap_mode="r"))
        self.chunk_keys = tuple(keys)

    def of(self, segments: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For ``segments`` int64 [m, 4] (source index, doc_id, start, length): each one's chunk number and
        its first token's position in that chunk (int64 [m] each)."""
        chunk = np.zeros(len(segments), np.int64)
        src = np.zeros(len(segments), np.int64)
        for s in np.unique(segments[:, 0]).tolist():
            mine = segments[:, 0] == s
            ids = segments[mine, 1]
            order = np.argsort(ids, kind="stable")  # read the file in order: fewer pages touched, sequentially
            rows = np.empty((len(ids), 2), np.int64)
            rows[order] = self._tables[s][ids[order]]
            chunk[mine] = rows[:, 0]
            src[mine] = rows[:, 1] + segments[mine, 2]
        return chunk, src

    def close(self) -> None:
        """Unmap the tables and remove their folder."""
        self._tables.clear()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> Locations:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
