"""``mixing.doc_lookup``: a source's document index read by ``doc_id``, a few rows at a time.

Each index here is written as the build's index writer writes one (:data:`mixing.ingest.doc_index.INDEX_SCHEMA`,
a ``ParquetWriter``, one ``write_table`` per chunk), in row groups of uneven sizes: one of a single row, groups
whose documents share a file and groups of one file per document (whole-file documents), groups with and without
metadata. Every read is checked against the rows as polars reads the whole file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mixing import doc_lookup
from mixing.doc_lookup import DocLookup, IndexMisfit
from mixing.ingest.doc_index import INDEX_SCHEMA

FP = "f" * 64
GROUPS = [5, 1, 7, 3, 6]  # rows per row group: the second holds a single document


def chunk(first: int, n: int, g: int) -> dict[str, list[Any]]:
    """Row group ``g``: documents ``first … first + n − 1``; even groups share one jsonl file and carry no
    metadata, odd ones are one file per document with metadata on every other row."""
    ids = list(range(first, first + n))
    shared = g % 2 == 0
    return {
        "doc_id": ids,
        "source": ["s"] * n,
        "file": [f"/d/part-{g}.jsonl" if shared else f"/d/f{i}.py" for i in ids],
        "line": [3 + 2 * k if shared else 0 for k in range(n)],  # a quarantined line between any two
        "n_tokens": [10 + (i * 7) % 13 for i in ids],
        "chunk": [f"c{g}"] * n,
        "offset": [0] * n,
        "meta": [None if shared or i % 2 else f'{{"path": "f{i}.py"}}' for i in ids],
        "tokenizer": [FP] * n,
    }


def write_index(path: Path, groups: list[int] = GROUPS, edit: Any = None, **options: Any) -> pl.DataFrame:
    """An index of row groups of ``groups`` rows at ``path`` (``edit(g, columns)`` may change a group's columns;
    ``options``: the ``ParquetWriter``'s); returns it as polars reads it."""
    schema = pl.DataFrame(schema=INDEX_SCHEMA).to_arrow().schema
    first = 0
    with pq.ParquetWriter(path, schema, **options) as writer:
        for g, n in enumerate(groups):
            columns = chunk(first, n, g)
            if edit is not None:
                edit(g, columns)
            writer.write_table(pa.table(columns, schema=schema))
            first += n
    return pl.read_parquet(path)


def expected(docs: pl.DataFrame, ids: list[int]) -> list[tuple[str, int, int, str | None]]:
    return [(r["file"], r["line"], r["n_tokens"], r["meta"]) for r in (docs.row(i, named=True) for i in ids)]


DELTA = {  # another encoding a writer may choose: the integers delta-encoded, uncompressed, meta plain
    "use_dictionary": ["source", "file", "chunk", "tokenizer"],
    "column_encoding": dict.fromkeys(["doc_id", "line", "n_tokens", "offset"], "DELTA_BINARY_PACKED"),
    "compression": "none",
}


@pytest.mark.parametrize("file_as", ["chosen", "plain", "dictionary"])
@pytest.mark.parametrize("options", [{}, DELTA], ids=["weir's writer", "delta-encoded"])
def test_rows_are_the_index_rows_first_and_last_groups_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], file_as: str
) -> None:
    """Whatever the encoding, and whether a group's files are read as a dictionary or plain."""
    if file_as != "chosen":
        monkeypatch.setattr(doc_lookup, "_FEW_FILES", -1 if file_as == "plain" else 1 << 40)
    docs = write_index(tmp_path / "docs.parquet", **options)
    index = DocLookup(tmp_path / "docs.parquet", FP)
    assert index.documents == len(docs) == sum(GROUPS)
    assert index.starts.tolist() == np.cumsum([0, *GROUPS]).tolist()
    last = len(docs) - 1
    for ids in (
        [0],  # the first row of the first group
        [last],  # the last row of the last group
        [0, 4, 5, 6, 12, last - 1, last],  # group edges, the single-row group, several rows of one group
        list(range(len(docs))),  # every row
        [],
    ):
        assert index.rows(np.array(ids, dtype=np.int64)) == expected(docs, ids), ids


def test_the_rows_of_a_group_without_metadata_are_none(tmp_path: Path) -> None:
    docs = write_index(tmp_path / "docs.parquet")
    rows = DocLookup(tmp_path / "docs.parquet", FP).rows(np.arange(5))  # group 0: no metadata at all
    assert [r[3] for r in rows] == [None] * 5 and docs["meta"][:5].null_count() == 5


def test_tokens_sum_every_group(tmp_path: Path) -> None:
    docs = write_index(tmp_path / "docs.parquet")
    assert DocLookup(tmp_path / "docs.parquet", FP).tokens() == int(docs["n_tokens"].sum())


def test_a_document_past_the_index_is_a_misfit(tmp_path: Path) -> None:
    write_index(tmp_path / "docs.parquet")
    index = DocLookup(tmp_path / "docs.parquet", FP)
    with pytest.raises(IndexMisfit, match=f"it has {sum(GROUPS)} documents, the shards name document {sum(GROUPS)}"):
        index.rows(np.array([3, sum(GROUPS)]))


def test_a_group_out_of_row_order_fails_when_read(tmp_path: Path) -> None:
    """Group 3's doc_ids are shifted: reading its rows (or counting tokens) fails, other groups read."""

    def shift(g: int, columns: dict[str, list[Any]]) -> None:
        if g == 3:
            columns["doc_id"] = [i + 1 for i in columns["doc_id"]]

    docs = write_index(tmp_path / "docs.parquet", edit=shift)
    index = DocLookup(tmp_path / "docs.parquet", FP)
    assert index.rows(np.array([0, 5, 17])) == expected(docs, [0, 5, 17])
    with pytest.raises(IndexMisfit, match="doc_id column is not the row order"):
        index.rows(np.array([13]))
    with pytest.raises(IndexMisfit, match="not the row order"):
        index.tokens()


def test_a_group_of_another_tokenizer_fails_when_read(tmp_path: Path) -> None:
    def other(g: int, columns: dict[str, list[Any]]) -> None:
        if g == len(GROUPS) - 1:
            columns["tokenizer"] = ["0" * 64] * len(columns["tokenizer"])

    write_index(tmp_path / "docs.parquet", edit=other)
    with pytest.raises(IndexMisfit, match="another tokenizer"):
        DocLookup(tmp_path / "docs.parquet", FP).rows(np.array([sum(GROUPS) - 1]))
    assert len(DocLookup(tmp_path / "docs.parquet", None).rows(np.array([sum(GROUPS) - 1]))) == 1  # not checked


def test_an_index_without_a_column_read_is_a_misfit(tmp_path: Path) -> None:
    docs = write_index(tmp_path / "full.parquet")
    docs.drop("tokenizer").write_parquet(tmp_path / "docs.parquet")
    with pytest.raises(IndexMisfit, match=r"lacks the columns \['tokenizer'\]"):
        DocLookup(tmp_path / "docs.parquet", FP)


def test_a_document_without_its_line_is_a_misfit(tmp_path: Path) -> None:
    def no_line(g: int, columns: dict[str, list[Any]]) -> None:
        if g == 2:
            columns["line"][1] = None

    write_index(tmp_path / "docs.parquet", edit=no_line)
    index = DocLookup(tmp_path / "docs.parquet", FP)
    assert len(index.rows(np.array([6, 8]))) == 2  # the rows around it read
    with pytest.raises(IndexMisfit, match="lacks its file, line or n_tokens"):
        index.rows(np.array([7]))


def test_a_missing_index_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        DocLookup(tmp_path / "docs.parquet", FP)
