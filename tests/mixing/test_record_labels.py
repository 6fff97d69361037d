"""``mixing.record_labels``: a document's ``line`` read as its file's format numbers it, from the name alone."""

from __future__ import annotations

import pytest

from mixing.record_labels import record_label


@pytest.mark.parametrize(
    ("file", "line", "meta", "label"),
    [
        ("/d/a.jsonl", 7, None, "line 7"),
        ("/d/a.jsonl.zst", 7, None, "line 7"),
        ("s3://b/p/a.parquet", 3, None, "row 3"),
        ("/d/a.CSV.gz", 2, None, "row 2"),
        ("/d/a.txt", 0, None, "whole file"),
        ("/d/a.txt", 4, None, "piece 4"),
        ("/d/lib/os.py", 0, '{"path": "/d/lib/os.py", "language": "python"}', "whole file"),
        ("/d/src.tar.gz", 5, '{"path": "pkg/m.py", "language": "python"}', "member 5 (pkg/m.py)"),
        ("/d/src.tar", 5, None, "member 5"),
    ],
)
def test_a_record_reads_as_its_format_numbers_it(file: str, line: int, meta: str | None, label: str) -> None:
    assert record_label(file, line, meta) == label
