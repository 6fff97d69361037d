"""A source's document index read by ``doc_id``: the rows of a few documents, without reading the index.

``sources/<name>/docs.parquet`` (:data:`mixing.ingest.doc_index.INDEX_SCHEMA`) holds one row per document in
``doc_id`` order, ``doc_id`` being the row's position, in row groups that never span two chunks (a source of
10 M small documents has hundreds). :class:`DocLookup` reads its footer once (each row group's size and
statistics) and then, for the documents asked, only the row groups holding them, and of those only the columns
a lookup shows: ``file`` (as a dictionary where a group names few files), ``line``, ``n_tokens``, and ``meta``
only where the group's statistics say it holds a value. A row group is the smallest thing parquet decodes, so a
lookup costs its distinct row groups, whatever their share of the index. The rows are taken from the arrays
by position (numpy for the integers, one scalar per row for the strings) without ``pyarrow.compute``, whose
import alone is tens of milliseconds of a ``weir lookup``.

**Checks**, from the statistics alone, of every row group a read touches (all of them for :meth:`tokens`):
its ``doc_id`` minimum and maximum are its first and last row positions, and its ``tokenizer`` is the
shards' (when both are recorded); at open, that the file has every column read or checked. A failure is an
:class:`IndexMisfit` saying what does not fit; its caller names the file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["COLUMNS", "DocLookup", "DocRow", "IndexMisfit"]

COLUMNS = ("doc_id", "file", "line", "n_tokens", "meta", "tokenizer")  # what a lookup reads or checks
# a group's file column up to this size (dictionary page and indices, uncompressed) reads as a dictionary: its
# documents share few names (a group of 16 Ki rows of one file takes ~200 bytes; of distinct files, ~40 a row)
_FEW_FILES = 1 << 16
DocRow = tuple[str, int, int, str | None]
"""One document's ``(file, line, n_tokens, meta)``, as its source's index holds them."""


class IndexMisfit(ValueError):
    """A document index that does not fit the shards read with it; the message says how, in a few words."""


class DocLookup:
    """Source index ``path`` opened (its footer read) for lookups by ``doc_id``; ``tokenizer``: the shards'
    tokenizer fingerprint (None: not checked).

    ``starts`` (int64 [groups + 1]): each row group's first ``doc_id``, then the documents in all. Opening
    raises what pyarrow raises for a missing (``FileNotFoundError``) or unreadable file, and
    :class:`IndexMisfit` when it lacks a column of :data:`COLUMNS`.
    """

    def __init__(self, path: Path | str, tokenizer: str | None) -> None:
        self.parquet = pq.ParquetFile(path)
        md = self._meta = self.parquet.metadata
        # a group whose documents share a few files reads file as a dictionary (it costs those few names); one
        # of distinct files (whole-file documents) and meta (each document's own JSON) read plain: building a
        # dictionary of distinct values costs twice what decoding them does
        self._by_dictionary = pq.ParquetFile(path, metadata=md, read_dictionary=["file"])
        self.tokenizer = tokenizer
        names = self.parquet.schema_arrow.names
        missing = [c for c in COLUMNS if c not in names]
        if missing:
            raise IndexMisfit(f"it lacks the columns {missing}")
        self._at = {c: names.index(c) for c in COLUMNS}
        sizes = [md.row_group(g).num_rows for g in range(md.num_row_groups)]
        self.starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        self._checked: set[int] = set()

    @property
    def documents(self) -> int:
        """Documents in the index (its rows)."""
        return int(self.starts[-1])

    def rows(self, ids: np.ndarray) -> list[DocRow]:
        """The rows of documents ``ids`` (int64, sorted ascending, distinct), in that order: each row group
        holding one read once. :class:`IndexMisfit` when an id is past the index or a group read fails its
        checks."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(ids):
            return []
        if ids[0] < 0 or ids[-1] >= self.documents:
            raise IndexMisfit(f"it has {self.documents} documents, the shards name document {ids[-1]}")
        groups = np.searchsorted(self.starts, ids, side="right") - 1
        cuts = np.flatnonzero(np.diff(groups)) + 1
        out: list[DocRow] = []
        for a, b in zip(np.r_[0, cuts].tolist(), np.r_[cuts, len(ids)].tolist(), strict=True):
            g = int(groups[a])
            out += self._group_rows(g, ids[a:b] - self.starts[g])
        return out

    def tokens(self) -> int:
        """The index's tokens (``n_tokens`` summed), one row group at a time, each checked."""
        total = 0
        for g in range(len(self.starts) - 1):
            self._check(g)
            col = self.parquet.read_row_group(g, columns=["n_tokens"], use_threads=False).column(0)
            total += sum(int(np.asarray(c.to_numpy(zero_copy_only=False), dtype=np.int64).sum()) for c in col.chunks)
        return total

    def _group_rows(self, g: int, at: np.ndarray) -> list[DocRow]:
        """Rows ``at`` (positions in row group ``g``, ascending) of group ``g``, read once."""
        self._check(g)
        group = self._meta.row_group(g)
        with_meta = not _all_null(group, self._at["meta"])
        columns = ["file", "line", "n_tokens", *(["meta"] if with_meta else [])]
        few_files = group.column(self._at["file"]).total_uncompressed_size <= _FEW_FILES
        reader = self._by_dictionary if few_files else self.parquet
        table = reader.read_row_group(g, columns=columns, use_threads=False)
        files = _strings(_array(table.column("file")), at)
        lines = _ints(_array(table.column("line")), at)
        n_tokens = _ints(_array(table.column("n_tokens")), at)
        metas = _strings(_array(table.column("meta")), at) if with_meta else [None] * len(at)
        rows: list[DocRow] = []
        for file, line, n, meta in zip(files, lines, n_tokens, metas, strict=True):
            if file is None or line is None or n is None:
                raise IndexMisfit("a document lacks its file, line or n_tokens")
            rows.append((file, line, n, meta))
        return rows

    def _check(self, g: int) -> None:
        """Row group ``g``'s statistics fit the shards (see the module's docstring); checked once."""
        if g in self._checked:
            return
        group = self._meta.row_group(g)
        ids = group.column(self._at["doc_id"]).statistics
        first, last = int(self.starts[g]), int(self.starts[g + 1]) - 1
        if ids is not None and ids.has_min_max and (ids.min, ids.max) != (first, last):
            raise IndexMisfit("its doc_id column is not the row order")
        tok = group.column(self._at["tokenizer"]).statistics
        known = self.tokenizer is not None and tok is not None and tok.has_min_max
        if known and not tok.min == tok.max == self.tokenizer:
            raise IndexMisfit("its documents were tokenized by another tokenizer than the shards'")
        self._checked.add(g)


def _all_null(group: pq.RowGroupMetaData, column: int) -> bool:
    """Whether ``group``'s statistics record its ``column``-th column as null in every row (False: unknown)."""
    stats = group.column(column).statistics
    return stats is not None and stats.has_null_count and stats.null_count == group.num_rows


def _array(col: pa.ChunkedArray) -> pa.Array:
    """A row group's column as one array (pyarrow hands out one chunk unless a column is huge)."""
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _ints(arr: pa.Array, at: np.ndarray) -> list[int | None]:
    """Integers at positions ``at`` of ``arr`` (None where null)."""
    if arr.null_count:
        return [arr[i].as_py() for i in at.tolist()]
    return np.asarray(arr.to_numpy(zero_copy_only=False), dtype=np.int64)[at].tolist()


def _strings(arr: pa.Array, at: np.ndarray) -> list[str | None]:
    """Strings at positions ``at`` of ``arr``, plain or dictionary-encoded (None where null)."""
    if isinstance(arr, pa.DictionaryArray) and not arr.null_count:
        values = arr.dictionary
        return [values[i].as_py() for i in arr.indices.to_numpy(zero_copy_only=False)[at].tolist()]
    return [arr[i].as_py() for i in at.tolist()]
