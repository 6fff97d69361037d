"""Ingest faults through a real build: poison records, a byte-order mark and
paths the index skips are named in the quarantine and the documents' metadata; the build goes on."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from mixing import load_mix
from mixing.ingest.documents import DocumentsError
from mixing.output.layout import BuildLayout
from pipelines.build import build_mix


def _metadata(instance: dg.DagsterInstance, source: str) -> dict[str, object]:
    result = instance.fetch_materializations(dg.AssetKey(["tiny", "documents"]), limit=10)
    for record in result.records:
        mat = record.asset_materialization
        if mat is not None and mat.partition == source:
            return {k: v.value for k, v in mat.metadata.items()}
    raise AssertionError(f"no documents materialization for {source}")


def _quarantine(layout: BuildLayout, source: str) -> list[dict[str, object]]:
    text = (layout.source_dir(source) / "quarantine.jsonl").read_bytes()
    return [json.loads(x) for x in text.split(b"\n") if x]


def test_poison_records_bom_and_skipped_paths_through_a_bpe_build(tiny_mix_path: Path, tmp_path: Path) -> None:
    data = tiny_mix_path.parent / "data"
    qa = data / "qa.jsonl"
    deep = b'{"q": ' + b"[" * 100_000 + b"]" * 100_000 + b', "a": "1"}\n'  # 200 KB, 100,000 levels
    cut_emoji = b'{"q": "a cut emoji \\ud83d", "a": "2"}\n'  # valid JSON: a lone surrogate escape
    qa.write_bytes(b"\xef\xbb\xbf" + qa.read_bytes() + cut_emoji + deep)  # a BOM before the first record
    notes = data / "notes"
    os.symlink("loop.txt", notes / "loop.txt")
    os.symlink("nowhere.txt", notes / "gone.txt")
    (notes / "folder.txt").mkdir()
    os.symlink("n00.txt", notes / "link.txt")  # a symlink to a file is read
    tiny_mix_path.write_text(tiny_mix_path.read_text().replace("{kind: bytes}", "{kind: bpe, vocab_size: 300}"))

    instance = dg.DagsterInstance.ephemeral()
    build_mix(load_mix(tiny_mix_path), tmp_path / "out", say=lambda _s: None, instance=instance)
    layout = BuildLayout(tmp_path / "out")

    qa_meta = _metadata(instance, "qa")
    assert qa_meta["quarantine_reasons"] == {"invalid JSON": 2, "invalid Unicode": 1}
    assert (qa_meta["docs_seen"], qa_meta["docs_kept"], qa_meta["docs_quarantined"]) == (43, 40, 3)
    docs = pl.read_parquet(layout.source_dir("qa") / "docs.parquet")
    assert docs["line"][0] == 1, "the first record, after the BOM, is kept"
    assert {q["line"]: q["reason"] for q in _quarantine(layout, "qa")} == {
        6: "invalid JSON",
        42: "invalid Unicode",
        43: "invalid JSON",
    }

    notes_meta = _metadata(instance, "notes")
    skipped = {"dangling symlink": 1, "symlink loop": 1, "is a directory": 1}
    assert notes_meta["quarantine_reasons"] == skipped
    assert (notes_meta["docs_seen"], notes_meta["docs_kept"]) == (16, 13)
    assert {Path(str(q["file"])).name: q["reason"] for q in _quarantine(layout, "notes")} == {
        "gone.txt": "dangling symlink",
        "loop.txt": "symlink loop",
        "folder.txt": "is a directory",
    }
    assert (layout.root / "shards").is_dir()


def test_a_template_field_no_record_has_is_one_line_naming_it(tiny_mix_path: Path, tmp_path: Path) -> None:
    tiny_mix_path.write_text(tiny_mix_path.read_text().replace("Q: {q}", "Q: {question}"))
    with pytest.raises(DocumentsError) as e:  # the documents stage, not the plan's "it has no documents"
        build_mix(load_mix(tiny_mix_path), tmp_path / "out", say=lambda _s: None)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("source 'qa' has no documents: 40 of 41 records lack template field 'question'"), msg


def test_names_not_utf8_and_every_line_end_through_a_build(tiny_mix_path: Path, tmp_path: Path) -> None:
    data = tiny_mix_path.parent / "data"
    with open(bytes(data) + b"/notes/caf\xe9.txt", "wb") as f:  # a Latin-1 name: U+DCE9 to Python
        f.write(b"Note from a Latin-1 name.\n")
    qa = data / "qa.jsonl"
    qa.write_bytes(qa.read_bytes().replace(b"\n", b"\r"))  # CR-only line ends, line 6 still the bad one
    with open(bytes(data) + b"/r\xe9sum\xe9.jsonl", "wb") as f:  # each line end, a bare \r between two records
        f.write(b'{"q": "x", "a": "1"}\r{broken\r\n{"q": "y", "a": "2"}\n{"q": "z", "a": "3"}\r')
    tiny_mix_path.write_text(tiny_mix_path.read_text().replace("/qa.jsonl", "/*.jsonl"))

    said: list[str] = []
    instance = dg.DagsterInstance.ephemeral()
    build_mix(load_mix(tiny_mix_path), tmp_path / "out", say=said.append, instance=instance)
    layout = BuildLayout(tmp_path / "out")
    assert all(s.encode("utf-8") for s in said)

    shown = {"notes": f"{data}/notes/caf\\xe9.txt", "qa": f"{data}/r\\xe9sum\\xe9.jsonl"}
    for source, path in shown.items():
        assert path in pl.read_parquet(layout.source_dir(source) / "index.parquet")["path"].to_list()
    notes = pl.read_parquet(layout.source_dir("notes") / "docs.parquet")
    assert shown["notes"] in notes["file"].to_list() and notes.height == 13
    assert (_metadata(instance, "notes")["docs_seen"], _metadata(instance, "notes")["docs_quarantined"]) == (13, 0)

    qa_meta = _metadata(instance, "qa")
    assert (qa_meta["docs_seen"], qa_meta["docs_kept"], qa_meta["docs_quarantined"]) == (45, 43, 2)
    assert {(q["file"], q["line"], q["reason"]) for q in _quarantine(layout, "qa")} == {
        (str(qa), 6, "invalid JSON"),
        (shown["qa"], 2, "invalid JSON"),
    }
    docs = pl.read_parquet(layout.source_dir("qa") / "docs.parquet")
    assert docs.filter(pl.col("file") == shown["qa"])["line"].to_list() == [1, 3, 4]
    assert docs.filter(pl.col("file") == str(qa))["line"].to_list() == [i for i in range(1, 42) if i != 6]
    assert (layout.root / "shards").is_dir()
