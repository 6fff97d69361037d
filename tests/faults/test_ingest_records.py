"""Well-formed records are not lost to their bytes: a UTF-8 byte-order mark,
a declared encoding, templates that can only name fields, and a one-line count of records lacking a field."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from mixing.ingest.documents import tokenize_source
from mixing.ingest.sources import read_records
from mixing.ingest.tokenizer import load_tokenizer
from mixing.mixfile.locations import MixError
from mixing.mixfile.mix import SourceSpec, TokenizerSpec, parse_mix

BOM = b"\xef\xbb\xbf"
TOK = load_tokenizer(TokenizerSpec(kind="bytes"), Path("."))


def texts(path: Path, spec: SourceSpec) -> list[tuple[int, str | None, str | None]]:
    return [(r.line, r.text, r.reason) for r in read_records(str(path), spec)]


CASES = {  # format, extra spec fields, file name, file bytes (without a BOM)
    "jsonl": ({"format": "jsonl"}, "a.jsonl", b'{"text": "first"}\n{"text": "second"}\n'),
    # (csv read by pyarrow skipped a BOM already; its Python fallback did not)
    "csv slow path": ({"format": "csv"}, "a.csv", b'text,n\nfirst,1\n"\xff\xfe",0","1"\nsecond,2\n'),
    "text": ({"format": "text"}, "a.txt", b"first document\n"),
    "text pieces": ({"format": "text", "separator": "\n\n"}, "a.txt", b"first\n\nsecond\n"),
    "code": ({"format": "code"}, "a.py", b"print('first')\n"),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # pyarrow, on the slow path
def test_a_leading_byte_order_mark_loses_no_record(tmp_path: Path, case: str) -> None:
    fields, name, data = CASES[case]
    spec = SourceSpec(uri="unused", **fields)  # type: ignore[arg-type]
    plain, marked = tmp_path / "plain", tmp_path / "marked"
    plain.mkdir()
    marked.mkdir()
    (plain / name).write_bytes(data)
    (marked / name).write_bytes(BOM + data)
    assert texts(marked / name, spec) == texts(plain / name, spec)
    assert texts(marked / name, spec)[0][1] is not None and "first" in texts(marked / name, spec)[0][1]  # type: ignore[operator]


LATIN1 = "café = 'naïve façade'  # déjà vu: ½ ¼ ©\n"


def test_a_latin1_code_file_is_kept_with_its_encoding_and_quarantined_without(tmp_path: Path) -> None:
    (tmp_path / "legacy.py").write_bytes(LATIN1.encode("latin-1"))
    strict = SourceSpec(uri="unused", format="code")
    assert [r.reason for r in read_records(str(tmp_path / "legacy.py"), strict)] == ["invalid UTF-8"]
    latin1 = SourceSpec(uri="unused", format="code", encoding="latin-1")
    assert [r.text for r in read_records(str(tmp_path / "legacy.py"), latin1)] == [LATIN1]
    replace = SourceSpec(uri="unused", format="code", errors="replace")
    (text,) = [r.text for r in read_records(str(tmp_path / "legacy.py"), replace)]
    assert text is not None and "\ufffd" in text and text.startswith("caf")


def test_the_stdlibs_own_latin1_module_is_kept_with_its_encoding() -> None:
    import sysconfig

    path = Path(sysconfig.get_paths()["stdlib"]) / "test" / "encoded_modules" / "module_iso_8859_1.py"
    if not path.exists():
        pytest.skip(f"{path} is not part of this Python")
    spec = SourceSpec(uri="unused", format="code", encoding="latin-1")
    (rec,) = read_records(str(path), spec)
    assert rec.text == path.read_bytes().decode("latin-1")
    assert [r.reason for r in read_records(str(path), SourceSpec(uri="unused", format="code"))] == ["invalid UTF-8"]


def test_csv_jsonl_and_text_decode_with_the_sources_encoding(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_bytes(f"text,n\n{LATIN1.strip()},1\n\x81 undefined in cp1252,2\n".encode("latin-1"))
    (tmp_path / "a.jsonl").write_bytes(json.dumps({"text": "“quoted” – cp1252"}, ensure_ascii=False).encode("cp1252"))
    (tmp_path / "a.txt").write_bytes(b"one \xe9\n\ntwo \xe8\n")
    csv_spec = SourceSpec(uri="unused", format="csv", encoding="cp1252")
    assert texts(tmp_path / "a.csv", csv_spec) == [(1, LATIN1.strip(), None), (2, None, "invalid encoding")]
    jsonl = SourceSpec(uri="unused", format="jsonl", encoding="cp1252")
    assert texts(tmp_path / "a.jsonl", jsonl) == [(1, "“quoted” – cp1252", None)]
    pieces = SourceSpec(uri="unused", format="text", separator="\n\n", encoding="latin-1")
    assert texts(tmp_path / "a.txt", pieces) == [(1, "one é", None), (2, "two è\n", None)]


def test_changing_the_encoding_never_reuses_a_chunk(tmp_path: Path) -> None:
    (tmp_path / "legacy.py").write_bytes(LATIN1.encode("latin-1"))
    files = pl.DataFrame({"path": [str(tmp_path / "legacy.py")], "fingerprint": ["fixed"]})
    out = tmp_path / "out"
    strict = tokenize_source("s", SourceSpec(uri="unused", format="code"), files, TOK, out)
    assert (strict.docs_kept, strict.docs_quarantined) == (0, 1)
    latin1 = tokenize_source("s", SourceSpec(uri="unused", format="code", encoding="latin-1"), files, TOK, out)
    assert (latin1.docs_kept, latin1.chunks_reused) == (1, 0)
    replace = tokenize_source("s", SourceSpec(uri="unused", format="code", errors="replace"), files, TOK, out)
    assert (replace.docs_kept, replace.chunks_reused) == (1, 0)


MIX = """\
name: t
tokenizer: {{kind: bytes}}
sequence: {{length: 64, global_batch: 4}}
sources:
  qa:
    uri: "x.jsonl"
    format: {fmt}
    {key}: {value}
curriculum:
  - {{phase: a, steps: 3, mixture: {{qa: 1}}}}
"""


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ('"{q.__class__.__mro__}"', "no attribute access"),
        ('"{q[a].__dict__}"', "no attribute access"),
        ('"{q!r}"', "conversions (!r, !s, !a) are not allowed"),
        ('"{q:{width}}"', "format spec '{width}' is not allowed"),
        ('"{q:>999999999}"', "format spec '>999999999' is not allowed"),
        ('"{0} and {}"', "has no name"),
        ('"a } b"', "Single '}' encountered"),
    ],
)
def test_a_template_may_only_name_fields_and_index_them(tmp_path: Path, value: str, problem: str) -> None:
    allowed = parse_mix(MIX.format(fmt="jsonl", key="template", value='"{q[a]} {q[b][0]} {n:.2f} {name:>6}"'))
    (tmp_path / "x.jsonl").write_text(json.dumps({"q": {"a": "A", "b": ["B"]}, "n": 2, "name": "x"}) + "\n")
    assert [r.text for r in read_records(str(tmp_path / "x.jsonl"), allowed.sources["qa"])] == ["A B 2.00      x"]
    with pytest.raises(MixError) as e:
        parse_mix(MIX.format(fmt="jsonl", key="template", value=value), "mix.yaml")
    assert str(e.value).startswith("mix.yaml:8: sources.qa.template: template"), str(e.value)
    assert problem in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("fmt", "key", "value", "problem"),
    [
        ("jsonl", "encoding", "klingon", "unknown encoding 'klingon'"),
        ("jsonl", "encoding", "utf-16", "not ASCII-compatible"),
        ("parquet", "encoding", "latin-1", "parquet strings are UTF-8"),
        ("csv", "errors", "surrogateescape", "'strict', 'replace' or 'ignore'"),
    ],
)
def test_an_encoding_that_cannot_work_is_refused_with_its_line(fmt: str, key: str, value: str, problem: str) -> None:
    with pytest.raises(MixError) as e:
        parse_mix(MIX.format(fmt=fmt, key=key, value=value), "mix.yaml")
    assert str(e.value).startswith("mix.yaml:"), str(e.value)
    assert problem in str(e.value)


def test_records_lacking_a_template_field_are_counted_in_one_line(tmp_path: Path) -> None:
    rows = [{"q": f"q{i}", "a": "x"} if i % 4 else {"a": "x"} for i in range(40)]
    (tmp_path / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = SourceSpec(uri="unused", format="jsonl", template="Q: {q} A: {a}")
    r = tokenize_source("qa", spec, [str(tmp_path / "qa.jsonl")], TOK, tmp_path / "out")
    assert r.missing_fields == {"template field 'q'": 10}
    assert r.warnings == ["source 'qa': 10 of 40 records lack template field 'q'"]
