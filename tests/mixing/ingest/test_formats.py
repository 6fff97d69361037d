"""Every source format read from files the tests write and from ../shared/data: records, lines, metadata."""

from __future__ import annotations

import gzip
import json
import os
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from mixing.ingest.filenames import shown_path
from mixing.ingest.formats import read_file
from mixing.ingest.records import REASONS
from mixing.mixfile.mix import SourceSpec
from tests.conftest import shared_path


def spec(**kw: object) -> SourceSpec:
    return SourceSpec(uri="unused", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_jsonl_plain_and_compressed(tmp_path: Path, suffix: str) -> None:
    raw = "".join(json.dumps({"text": f"doc {i}", "id": i}) + "\n" for i in range(50)).encode()
    p = tmp_path / f"a.jsonl{suffix}"
    p.write_bytes({"": raw, ".gz": gzip.compress(raw), ".zst": zstandard.ZstdCompressor().compress(raw)}[suffix])
    recs = list(read_file(str(p), spec(format="jsonl", metadata=("id",))))
    assert [r.text for r in recs] == [f"doc {i}" for i in range(50)]
    assert [r.line for r in recs] == list(range(1, 51))
    assert json.loads(recs[7].meta or "") == {"id": 7}


def test_parquet_nested_chat_and_template_stream_in_batches(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}], "k": {"v": i}}
        for i in range(25)
    ]
    p = tmp_path / "chat.parquet"
    pq.write_table(pa.Table.from_pylist(rows), p, row_group_size=10)
    recs = list(read_file(str(p), spec(format="parquet", messages="messages", chat_template="plain", batch_rows=4)))
    assert [r.line for r in recs] == list(range(1, 26))
    assert recs[3].text == "User: q3\n\nAssistant: a3"
    recs = list(read_file(str(p), spec(format="parquet", template="{messages[0][content]}={k[v]}")))
    assert recs[24].text == "q24=24"


def test_csv_rows_and_invalid_row(tmp_path: Path) -> None:
    p = tmp_path / "t.csv"
    p.write_text('text,n\nhello,1\n"two\nlines",2\nbad,row,extra\n123,4\n')
    recs = list(read_file(str(p), spec(format="csv")))
    assert sorted((r.text or "") for r in recs if r.error is None) == ["123", "hello", "two\nlines"]
    assert [r.reason for r in recs if r.error] == ["invalid CSV row"]


def test_csv_invalid_utf8_row_is_quarantined_alone(tmp_path: Path) -> None:
    # Rows across several pyarrow blocks (1 MB each): the bad rows' blocks are decoded row by row.
    rows = [f"row {i} ".encode() + b"x" * 3000 for i in range(1000)]
    rows[3] = b"bad \xff\xfe row"
    rows[700] = b"also \xc3 bad"
    p = tmp_path / "u.csv"
    n = [b"\xff" if i == 900 else b"%d" % i for i in range(1000)]  # row 900: bad bytes in an unread column
    p.write_bytes(b"text,n\n" + b"".join(r + b"," + k + b"\n" for r, k in zip(rows, n, strict=True)))
    recs = list(read_file(str(p), spec(format="csv")))
    assert [(r.line, r.reason) for r in recs if r.error] == [(4, "invalid UTF-8"), (701, "invalid UTF-8")]
    kept = [r.text for r in recs if r.error is None]
    assert kept == [r.decode() for i, r in enumerate(rows) if i not in (3, 700)]
    assert [r.line for r in recs] == list(range(1, 1001))


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # pyarrow's row handler
def test_csv_malformed_row_not_utf8_falls_back_and_keeps_the_rest(tmp_path: Path) -> None:
    # pyarrow cannot even report this row (its text is not UTF-8): the reader resumes with Python's csv.
    rows = [b'"row %d %s",%d\n' % (i, b"x" * 3000, i) for i in range(800)]
    rows[500] = b'"\xff\xfe",0","1"\n'
    rows[600] = b'"row 600 %s",\xff\n' % (b"x" * 3000)  # bad bytes in an unread column: kept
    p = tmp_path / "m.csv"
    p.write_bytes(b"text,n\n" + b"".join(rows))
    recs = list(read_file(str(p), spec(format="csv")))
    assert [r.reason for r in recs if r.error] == ["invalid CSV row"]
    assert [r.text for r in recs if r.error is None] == [f"row {i} " + "x" * 3000 for i in range(800) if i != 500]


def test_text_whole_file_and_separator(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_text("one\n\ntwo\n\n\n\nthree\n")
    assert [r.text for r in read_file(str(p), spec())] == ["one\n\ntwo\n\n\n\nthree\n"]
    recs = list(read_file(str(p), spec(separator="\n\n")))
    assert [(r.line, r.text, r.reason) for r in recs] == [
        (1, "one", None),
        (2, "two", None),
        (3, None, "empty document"),  # between two separators: counted, not skipped
        (4, "three\n", None),
    ]
    p.write_text("one\n\n\n\ntwo\n\n")  # a blank tail after the last separator ends the file: no piece
    recs = list(read_file(str(p), spec(separator="\n\n")))
    assert [(r.line, r.reason) for r in recs] == [(1, None), (2, "empty document"), (3, None)]


def test_text_separator_across_read_chunks(tmp_path: Path) -> None:
    pieces = [f"piece {i} " + "x" * (i * 997 % 300_000) for i in range(40)]
    p = tmp_path / "big.txt"
    p.write_text("\n---\n".join(pieces))
    assert [r.text for r in read_file(str(p), spec(separator="\n---\n"))] == pieces


def test_code_tree_tar_keeps_path_and_language(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("print(1)\n")
    (tmp_path / "src" / "b.rs").write_text("fn main() {}\n")
    (tmp_path / "src" / "data.bin").write_bytes(b"\0\1")
    with tarfile.open(tmp_path / "src.tar", "w") as t:
        t.add(tmp_path / "src", "src")
    recs = list(read_file(str(tmp_path / "src.tar"), spec(format="code")))
    metas = sorted(json.loads(r.meta or "")["language"] for r in recs)
    assert metas == ["python", "rust"]
    assert all(r.error is None for r in recs)


def test_unreadable_file_is_a_record_not_an_exception(tmp_path: Path) -> None:
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip at all")
    for p in (tmp_path / "missing.jsonl", tmp_path / "bad.jsonl.gz"):
        recs = list(read_file(str(p), spec(format="jsonl")))
        assert [r.reason for r in recs] == ["unreadable file"]


def test_every_reason_is_known() -> None:
    assert len(set(REASONS)) == len(REASONS)


# ---- line ends: \n, \r\n and a bare \r each end a record, and line numbers count them alike ----

LINE_ENDS = {  # the end after each of 5 lines; "mixed" has each kind, a bare \r between two records included
    "lf": [b"\n"] * 5,
    "crlf": [b"\r\n"] * 5,
    "cr": [b"\r"] * 5,
    "mixed": [b"\r", b"\n", b"\r\n", b"\r", b""],  # the last line without an end
}


@pytest.mark.parametrize("ends", LINE_ENDS)
def test_jsonl_each_line_end_ends_a_record(tmp_path: Path, ends: str) -> None:
    lines = [b'{"text": "one"}', b'{"text": "two"}', b"{not json", b"", b'{"text": "five"}']
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"".join(x + e for x, e in zip(lines, LINE_ENDS[ends], strict=True)))
    recs = [(r.line, r.text, r.reason) for r in read_file(str(p), spec(format="jsonl"))]
    assert recs == [(1, "one", None), (2, "two", None), (3, None, "invalid JSON"), (5, "five", None)]


@pytest.mark.parametrize("ends", LINE_ENDS)
def test_jsonl_record_too_large_ends_at_any_line_end(tmp_path: Path, ends: str) -> None:
    # Lines are read 41 bytes at a time (max_record_bytes + 1): line 3, of 40 bytes, has its \r\n cut in two.
    three = b'{"text": "' + b"t" * 28 + b'"}'
    lines = [b'{"text": "one"}', b'{"text": "' + b"z" * 100 + b'"}', three, b"", b'{"text": "' + b"y" * 23]
    p = tmp_path / "a.jsonl"
    p.write_bytes(b"".join(x + e for x, e in zip(lines, LINE_ENDS[ends], strict=True)))
    recs = list(read_file(str(p), spec(format="jsonl", max_record_bytes=40)))
    assert [(r.line, r.text, r.reason) for r in recs] == [
        (1, "one", None),
        (2, None, "record too large"),
        (3, "t" * 28, None),
        (5, None, "invalid JSON"),  # a last line cut short, without its end
    ]
    assert recs[1].error == f"record too large: {112 + len(LINE_ENDS[ends][1])} bytes > max_record_bytes=40"


@pytest.mark.parametrize("encoding", ["utf-8", "latin-1"])  # pyarrow, and Python's csv module
@pytest.mark.parametrize("ends", ["lf", "crlf", "cr"])
def test_csv_each_line_end_ends_a_row(tmp_path: Path, ends: str, encoding: str) -> None:
    e = LINE_ENDS[ends][0]
    p = tmp_path / "t.csv"
    p.write_bytes(e.join([b"text,n", b"hello,1", b'"two' + e + b'lines",2', b"123,4", b""]))
    recs = [(r.line, r.text, r.reason) for r in read_file(str(p), spec(format="csv", encoding=encoding))]
    assert recs == [(1, "hello", None), (2, f"two{e.decode()}lines", None), (3, "123", None)]


BLANK_LINES = {  # three blank-line separators and the last line's end, per kind of line end
    "lf": [b"\n\n"] * 3 + [b"\n"],
    "crlf": [b"\r\n\r\n"] * 3 + [b"\r\n"],
    "cr": [b"\r\r"] * 3 + [b"\r"],
    "mixed": [b"\r\n\r", b"\n\r", b"\r\r\n", b""],
}


@pytest.mark.parametrize("ends", BLANK_LINES)
def test_text_separator_of_newlines_matches_any_line_end(tmp_path: Path, ends: str) -> None:
    e = BLANK_LINES[ends]
    p = tmp_path / "t.txt"
    p.write_bytes(b"one" + e[0] + b"two\r\nlines" + e[1] + b"three" + e[2] + b"four" + e[3])
    recs = [(r.line, r.text, r.reason) for r in read_file(str(p), spec(separator="\n\n"))]
    assert recs == [
        (1, "one", None),
        (2, "two\r\nlines", None),  # a piece keeps its own line ends
        (3, "three", None),
        (4, "four" + e[3].decode(), None),  # as with \n: the file's last line end stays in the last piece
    ]
    big = tmp_path / "big.txt"  # pieces across the reader's 1 MiB reads; the first read ends inside a separator
    pieces = [b"p%d " % i + b"x" * (i * 99_991 % 700_000) for i in range(12)]
    pieces[0] = b"x" * ((1 << 20) - 3)  # with \r\n\r\n: the read ends after its second \r
    big.write_bytes(e[0].join(pieces))
    assert [r.text for r in read_file(str(big), spec(separator="\n\n"))] == [x.decode() for x in pieces]


def test_text_separator_holding_cr_is_literal(tmp_path: Path) -> None:
    p = tmp_path / "t.txt"
    p.write_bytes(b"one\n\ntwo\r\n\r\nthree\n")
    assert [r.text for r in read_file(str(p), spec(separator="\r\n\r\n"))] == ["one\n\ntwo", "three\n"]
    assert [r.text for r in read_file(str(p), spec(separator="---"))] == ["one\n\ntwo\r\n\r\nthree\n"]


def test_a_file_name_that_is_not_utf8_is_read_by_its_shown_name(tmp_path: Path) -> None:
    name = os.fsdecode(bytes(tmp_path) + b"/caf\xe9 \\ x.jsonl")  # Latin-1 bytes and a backslash
    with open(name, "wb") as f:
        f.write(b'{"text": "kept"}\r{oops\r\n')
    shown = shown_path(name)
    assert shown == f"{tmp_path}/caf\\xe9 \\\\ x.jsonl" and shown.encode("utf-8")
    recs = list(read_file(shown, spec(format="jsonl")))
    assert [(r.file, r.line, r.text, r.reason) for r in recs] == [
        (shown, 1, "kept", None),
        (shown, 2, None, "invalid JSON"),
    ]
    assert shown_path(str(tmp_path / "plain é.txt")) == str(tmp_path / "plain é.txt")  # UTF-8 names are themselves


# ---- real data from ../shared/data (skipped when absent) ----


def test_shared_parquet_chat_messages() -> None:
    p = shared_path("data", "simplerl_math_level3to5_parquet", "train.parquet")
    recs = list(read_file(str(p), spec(format="parquet", messages="prompt", metadata=("extra_info",), batch_rows=1000)))
    assert len(recs) == 8523 and all(r.error is None for r in recs)
    assert recs[0].text is not None and recs[0].text.startswith("<|im_start|>user\n")
    assert "answer" in json.loads(recs[0].meta or "")["extra_info"]


def test_shared_jsonl_gz_and_template() -> None:
    p = shared_path("data", "hh_rlhf_harmless_base_test", "test.jsonl.gz")
    recs = list(read_file(str(p), spec(format="jsonl", field="chosen")))
    assert len(recs) > 1000 and all(r.error is None for r in recs)
    p = shared_path("data", "gsm8k", "test.jsonl")
    recs = list(read_file(str(p), spec(format="jsonl", template="{question}\n\n{answer}")))
    assert len(recs) == sum(1 for _ in p.open()) and all(r.error is None for r in recs)


def test_shared_text() -> None:
    p = shared_path("data", "tinyshakespeare", "input.txt")
    recs = list(read_file(str(p), spec(separator="\n\n")))
    assert len(recs) > 1000
    assert "".join(r.text or "" for r in recs).replace("\n", "") == p.read_text().replace("\n", "")


def test_spec_rejects_template_and_messages_together() -> None:
    from mixing.mixfile.locations import MixError
    from mixing.mixfile.mix import parse_mix

    mix = """
name: m
sequence: {length: 64, global_batch: 2}
sources:
  s: {uri: "x/*.jsonl", format: jsonl, template: "{a}", messages: chat}
curriculum:
  - {phase: p, steps: 1, mixture: {s: 1.0}}
"""
    with pytest.raises(MixError, match=r":5: sources\.s: .*either 'template' or 'messages'"):
        parse_mix(mix)


def test_a_record_of_tens_of_megabytes_is_quarantined_and_its_neighbours_kept(tmp_path: Path) -> None:
    p = tmp_path / "big.jsonl"
    with p.open("w") as f:
        f.write(json.dumps({"text": "before"}) + "\n")
        f.write('{"text": "' + "z" * (20 << 20) + '"}\n')  # 20 MiB > the default max_record_bytes (16 MiB)
        f.write(json.dumps({"text": "after"}) + "\n")
    recs = list(read_file(str(p), spec(format="jsonl")))
    assert [(r.line, r.text, r.reason) for r in recs] == [
        (1, "before", None),
        (2, None, "record too large"),
        (3, "after", None),
    ]
    assert recs[1].sample is not None and len(recs[1].sample) <= 200


def test_shared_nested_jsonl_template_and_multilingual_text() -> None:
    p = shared_path("data", "self_instruct_seed_tasks", "seed_tasks.jsonl")
    recs = list(read_file(str(p), spec(format="jsonl", template="{instruction}\n{instances[0][output]}")))
    assert len(recs) == sum(1 for _ in p.open()) and all(r.error is None for r in recs)
    folder = shared_path("data", "udhr2_multilingual", "udhr2")
    files = sorted(folder.glob("*.txt"))
    recs = [r for f in files for r in read_file(str(f), spec())]
    assert len(recs) == len(files)  # one record per file: a document or a counted reason, never nothing
    empty = [f for f in files if not f.read_bytes().strip()]
    assert sum(r.reason == "empty document" for r in recs) == len(empty)
    kept = [r.text for r in recs if r.error is None]
    assert len(kept) + len(empty) == len(files) and any("人" in (t or "") for t in kept)
