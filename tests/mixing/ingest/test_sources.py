"""Source index: globs and code folders, fingerprints that change exactly when a file changes, names that are not
UTF-8."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest

from mixing.ingest.chunks import chunk_keys
from mixing.ingest.sources import SourceIndexError, file_digest, index_source, read_records
from mixing.ingest.tokenizer import load_tokenizer
from mixing.mixfile.mix import TokenizerSpec, parse_mix

MIX = """
name: m
sequence: {{length: 64, global_batch: 2}}
sources:
  s: {{uri: "{uri}", format: {fmt}}}
curriculum:
  - {{phase: p, steps: 1, mixture: {{s: 1.0}}}}
"""


def mix_for(uri: Path | str, fmt: str = "text"):  # type: ignore[no-untyped-def]
    return parse_mix(MIX.format(uri=uri, fmt=fmt))


def test_code_folder_takes_known_languages_and_tars(tmp_path: Path) -> None:
    for rel in ("a.py", "pkg/b.rs", "pkg/deep/c.go", "notes.bin", "bundle.tar"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"x")
    idx = index_source(mix_for(tmp_path, "code"), "s")
    names = [Path(p).relative_to(tmp_path).as_posix() for p in idx["path"]]
    assert names == ["a.py", "bundle.tar", "pkg/b.rs", "pkg/deep/c.go"]


def test_fingerprint_changes_only_for_the_changed_file(tmp_path: Path) -> None:
    for i in range(3):
        (tmp_path / f"f{i}.txt").write_text(f"doc {i}")
    mix = mix_for(f"{tmp_path}/*.txt")
    before = index_source(mix, "s")
    p = tmp_path / "f1.txt"
    p.write_text("doc one, changed")
    os.utime(p, ns=(p.stat().st_atime_ns, p.stat().st_mtime_ns + 10**9))
    after = index_source(mix, "s")
    changed = [a != b for a, b in zip(before["fingerprint"], after["fingerprint"], strict=True)]
    assert changed == [False, True, False]


def test_nothing_matches_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SourceIndexError, match="no file matches"):
        index_source(mix_for(f"{tmp_path}/*.jsonl", "jsonl"), "s")


def _named(folder: Path, name: bytes, data: bytes) -> str:
    """A file whose name has the bytes ``name`` (Python holds what is not UTF-8 as lone surrogates)."""
    path = os.fsdecode(bytes(folder) + b"/" + name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def test_a_name_that_is_not_utf8_is_listed_escaped_and_read(tmp_path: Path) -> None:
    _named(tmp_path, b"caf\xe9.txt", b"a Latin-1 name")  # U+DCE9 to Python: no UTF-8, JSON or parquet for it
    _named(tmp_path, b"plain.txt", b"a plain name")
    idx = index_source(mix_for(f"{tmp_path}/*.txt"), "s")
    assert idx["path"].to_list() == [f"{tmp_path}/caf\\xe9.txt", f"{tmp_path}/plain.txt"]
    assert idx["skipped"].to_list() == [None, None]
    idx.write_parquet(tmp_path / "index.parquet")  # every path is UTF-8 text now
    json.dumps(idx.to_dicts(), ensure_ascii=False).encode("utf-8")
    spec = mix_for(f"{tmp_path}/*.txt").sources["s"]
    assert [r.text for p in idx["path"] for r in read_records(p, spec)] == ["a Latin-1 name", "a plain name"]
    tok = load_tokenizer(TokenizerSpec(kind="bytes"), Path("."))
    assert len(chunk_keys(idx, tok, spec)) >= 1


def test_a_folder_name_that_is_not_utf8_and_a_name_like_an_escape(tmp_path: Path) -> None:
    os.mkdir(bytes(tmp_path) + b"/d\xff")
    _named(tmp_path, b"d\xff/a.py", b"print('in a folder named with 0xff')\n")
    _named(tmp_path, b"b\xe9.py", b"print('latin-1')\n")
    _named(tmp_path, b"b\\xe9.py", b"print('a name with a backslash, as the escape of the other')\n")
    idx = index_source(mix_for(tmp_path, "code"), "s")
    rows = {(Path(p).relative_to(tmp_path).as_posix(), s) for p, s in idx.select("path", "skipped").iter_rows()}
    clash = "unreadable file: its name is not UTF-8, and its escaped form names another file"
    assert rows == {("b\\xe9.py", None), ("b\\xe9.py", clash), ("d\\xff/a.py", None)}
    spec = mix_for(tmp_path, "code").sources["s"]
    texts = {p: [r.text for r in read_records(p, spec)] for p in idx.filter(pl.col("skipped").is_null())["path"]}
    assert texts == {
        f"{tmp_path}/b\\xe9.py": ["print('a name with a backslash, as the escape of the other')\n"],
        f"{tmp_path}/d\\xff/a.py": ["print('in a folder named with 0xff')\n"],
    }


def test_names_are_below_the_uris_fixed_folder_and_digests_follow_the_bytes(tmp_path: Path) -> None:
    for rel in ("d/a.txt", "d/sub/b.txt", "d/sub/deep/c.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(f"text of {rel}\n")
    assert index_source(mix_for(f"{tmp_path}/d/**/*.txt"), "s")["name"].to_list() == ["a.txt", "sub/b.txt"]
    assert index_source(mix_for(f"{tmp_path}/d/s*/*.txt"), "s")["name"].to_list() == ["sub/b.txt"]
    assert index_source(mix_for(tmp_path / "d" / "a.txt"), "s")["name"].to_list() == ["a.txt"]
    assert index_source(mix_for(tmp_path / "d" / "sub", "code"), "s")["name"].to_list() == ["deep/c.py"]

    rows = list(index_source(mix_for(f"{tmp_path}/d/**/*.txt"), "s").iter_rows(named=True))
    digests = [file_digest(r) for r in rows]
    os.utime(tmp_path / "d" / "a.txt", (1, 1))  # another mtime: the listing's row no longer describes the file
    assert digests[0] is not None and file_digest(rows[0]) is None, "a file written since its listing: no digest"
    again = list(index_source(mix_for(f"{tmp_path}/d/**/*.txt"), "s").iter_rows(named=True))
    assert [file_digest(r) for r in again] == digests, "the same bytes, the same digest"
    assert file_digest({**again[0], "fingerprint": None}) is None, "a file the index could not identify"
