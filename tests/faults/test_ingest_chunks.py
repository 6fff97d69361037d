"""A damaged cached chunk never spreads: a rebuild verifies every reused chunk, re-tokenizes a damaged one,
names it, and its outputs equal a clean build's."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import polars as pl
import pytest

from mixing.ingest.documents import tokenize_source
from mixing.ingest.tokenizer import load_tokenizer
from mixing.mixfile.mix import SourceSpec, TokenizerSpec
from tests.pipelines.test_incremental import build, same_outputs

FILES = ("tokens.bin", "docs.parquet", "quarantine.jsonl", "report.json")


def flip_bit(path: Path) -> None:
    """Flip one bit in the middle of ``path`` (in place: a hard link to it sees the flip too)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_the_previous_builds_chunk_does_not_reach_the_rebuild(
    tiny_mix_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = build(tiny_mix_path, tmp_path / "first")
    damaged = []
    for source, name in {"notes": "tokens.bin", "qa": "report.json"}.items():
        chunk = sorted((first.source_dir(source) / "chunks").iterdir())[0]
        flip_bit(chunk / name)  # the rebuild hard-links this very file
        damaged.append((source, chunk.name, name))

    with caplog.at_level(logging.WARNING, logger="weir.documents"):
        second = build(tiny_mix_path, tmp_path / "second", previous=first.root)
    same_outputs(second, build(tiny_mix_path, tmp_path / "clean"), ["notes", "qa"])  # shards and manifest too
    for source, key, _name in damaged:
        msg = f"chunk {key} of source {source!r} was damaged ("
        assert any(m.startswith(msg) and m.endswith("re-tokenized") for m in caplog.messages), caplog.messages
    assert any("tokens.bin sha256 mismatch" in m for m in caplog.messages)


@pytest.mark.parametrize("name", FILES)
def test_every_chunk_file_is_verified_on_reuse(tmp_path: Path, name: str) -> None:
    data = tmp_path / "data"
    data.mkdir()
    paths = []
    for i in range(40):  # one chunk or a few (a path-determined boundary about every 128 files)
        p = data / f"f{i:02d}.jsonl"
        p.write_text(json.dumps({"text": f"document {i} " * (i + 1)}) + "\n{broken\n")
        paths.append(str(p))
    index = pl.DataFrame({"path": paths, "fingerprint": [f"v1{p}" for p in paths]})  # as an index: reusable
    spec = SourceSpec(uri="unused", format="jsonl")
    tok = load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path)
    first = tokenize_source("s", spec, index, tok, tmp_path / "first")
    shutil.copytree(tmp_path / "first", tmp_path / "second")
    chunk = sorted((tmp_path / "second" / "chunks").iterdir())[-1]
    flip_bit(chunk / name)

    again = tokenize_source("s", spec, index, tok, tmp_path / "second")
    assert again.chunks_damaged == [chunk.name]
    assert again.chunks_reused == first.chunks - 1
    assert len(again.warnings) == 1 and chunk.name in again.warnings[0]
    for f in ("docs.parquet", "quarantine.jsonl", f"chunks/{chunk.name}/tokens.bin"):
        assert (tmp_path / "second" / f).read_bytes() == (tmp_path / "first" / f).read_bytes(), f
    assert (again.docs_seen, again.docs_kept, again.docs_quarantined) == (80, 40, 40)
