"""mixing/ingest/relocation.py, through ``tokenize_source``: chunks found again by content. A source's folder
moved, copied (new mtimes) or reached through a link, or the mix loaded from another current directory, reuses every
chunk whose files hold the same bytes, and its documents and quarantine name the files where they are now; a
changed file's chunk, or a damaged one, is tokenized again."""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

import polars as pl
import pytest

import mixing.ingest.chunks as chunks_module
from contract.store import Store
from mixing import Mix, load_mix
from mixing.ingest.chunk_store import present_keys
from mixing.ingest.documents import TokenizeReport, tokenize_source
from mixing.ingest.sources import index_source
from mixing.ingest.tokenizer import load_tokenizer
from mixing.mixfile.mix import TokenizerSpec
from tests.conftest import TINY_MIX, write_tiny_sources
from tests.faults.test_ingest_chunks import flip_bit


@pytest.fixture(autouse=True)
def _several_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chunks_module, "_GROUP", 3)  # the 12 notes in several chunks, so one can differ


def tiny(folder: Path) -> Path:
    """The tiny mix and its data in ``folder``, the mix naming its data relative to itself."""
    write_tiny_sources(folder / "data")
    (folder / "tiny.yaml").write_text(TINY_MIX.format(root="data"))
    return folder / "tiny.yaml"


def tokenize(mix: Mix, out: Path, source: str = "notes") -> TokenizeReport:
    tok = load_tokenizer(TokenizerSpec(kind="bytes"), out)
    return tokenize_source(source, mix.sources[source], index_source(mix, source), tok, out / source)


def assert_like_a_clean_tokenization(mix: Mix, out: Path, tmp_path: Path, source: str = "notes") -> None:
    """``out``'s index and quarantine equal a tokenization from scratch of the files where they are now."""
    clean = tmp_path / "clean"
    shutil.rmtree(clean, ignore_errors=True)
    assert tokenize(mix, clean, source).chunks_reused == 0
    docs = pl.read_parquet(out / source / "docs.parquet")
    assert docs.equals(pl.read_parquet(clean / source / "docs.parquet"))
    assert (out / source / "quarantine.jsonl").read_bytes() == (clean / source / "quarantine.jsonl").read_bytes()


def test_a_moved_folder_reuses_every_chunk_naming_the_files_where_they_are_now(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = {s: tokenize(load_mix(tiny(tmp_path / "old")), out, s) for s in ("notes", "qa")}
    assert first["notes"].chunks > 2
    inodes = {p.stat().st_ino for p in out.glob("*/chunks/*/tokens.bin")}
    (tmp_path / "old").rename(tmp_path / "new")
    mix = load_mix(tmp_path / "new" / "tiny.yaml")
    for s in ("notes", "qa"):
        again = tokenize(mix, out, s)
        assert again.chunks_reused == again.chunks_relocated == again.chunks == first[s].chunks, again
        assert_like_a_clean_tokenization(mix, out, tmp_path, s)
    assert {p.stat().st_ino for p in out.glob("*/chunks/*/tokens.bin")} == inodes, "tokens linked, never rewritten"
    (bad,) = (json.loads(line) for line in (out / "qa" / "quarantine.jsonl").read_text().splitlines())
    assert bad["file"] == str(tmp_path / "new" / "data" / "qa.jsonl")
    assert tokenize(mix, out).chunks_relocated == 0, "relocated once: the chunks have their new keys"


def test_a_copy_with_new_mtimes_reuses_its_chunks_and_a_changed_file_is_tokenized_again(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = tokenize(load_mix(tiny(tmp_path / "old")), out)
    shutil.copytree(tmp_path / "old", tmp_path / "copy", copy_function=shutil.copyfile)  # new mtimes
    notes = tmp_path / "copy" / "data" / "notes"
    os.utime(notes / "n03.txt", (1, 1))  # another fingerprint, the same bytes
    mix = load_mix(tmp_path / "copy" / "tiny.yaml")
    again = tokenize(mix, out)
    assert again.chunks_reused == again.chunks == first.chunks
    assert_like_a_clean_tokenization(mix, out, tmp_path)

    (notes / "n05.txt").write_text((notes / "n05.txt").read_text().replace("word", "wort"))  # same size, other bytes
    changed = tokenize(mix, out)
    assert changed.chunks_reused == changed.chunks - 1
    assert_like_a_clean_tokenization(mix, out, tmp_path)


def test_data_reached_through_a_linked_folder_reuses_every_chunk(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = tokenize(load_mix(tiny(tmp_path / "a")), out)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "data").symlink_to(tmp_path / "a" / "data", target_is_directory=True)
    shutil.copy(tmp_path / "a" / "tiny.yaml", tmp_path / "b" / "tiny.yaml")
    mix = load_mix(tmp_path / "b" / "tiny.yaml")
    assert index_source(mix, "notes")["path"][0].startswith(str(tmp_path / "b" / "data"))  # other paths, other keys
    again = tokenize(mix, out)
    assert again.chunks_reused == again.chunks_relocated == first.chunks
    assert_like_a_clean_tokenization(mix, out, tmp_path)


def test_the_same_mix_from_another_current_directory_has_the_same_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny(tmp_path / "project")
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path / "project")
    first = tokenize(load_mix(Path("tiny.yaml")), out)
    monkeypatch.chdir(tmp_path)
    again = tokenize(load_mix(Path("project") / "tiny.yaml"), out)
    assert again.chunks_reused == again.chunks == first.chunks and again.chunks_relocated == 0


@pytest.mark.parametrize("name", ["tokens.bin", "docs.parquet"])
def test_a_damaged_chunk_is_not_carried_to_its_new_place(tmp_path: Path, name: str) -> None:
    out = tmp_path / "out"
    first = tokenize(load_mix(tiny(tmp_path / "old")), out)
    chunk = sorted((out / "notes" / "chunks").iterdir())[0]
    flip_bit(chunk / name)
    (tmp_path / "old").rename(tmp_path / "new")
    mix = load_mix(tmp_path / "new" / "tiny.yaml")
    again = tokenize(mix, out)
    if name == "tokens.bin":  # relocated unread, then caught by the check every reused chunk gets
        assert len(again.chunks_damaged) == 1 and "tokens.bin sha256 mismatch" in again.warnings[0]
    else:  # its documents do not match their checksum: never relocated, tokenized instead
        assert again.chunks_damaged == [] and again.chunks_relocated == first.chunks - 1
    assert again.chunks_reused == first.chunks - 1
    assert_like_a_clean_tokenization(mix, out, tmp_path)


def test_a_code_sources_meta_path_moves_with_its_file(tmp_path: Path) -> None:
    src = tmp_path / "old" / "repo"
    src.mkdir(parents=True)
    for i in range(5):
        (src / f"m{i}.py").write_text(f"def f{i}():\n    return {i}\n")
    (tmp_path / "old" / "mix.yaml").write_text(
        TINY_MIX.format(root="x").split("sources:")[0]
        + 'sources:\n  code: {uri: "repo", format: code}\n'
        + "curriculum:\n  - {phase: only, steps: 2, mixture: {code: 1.0}}\n"
    )
    out = tmp_path / "out"
    tokenize(load_mix(tmp_path / "old" / "mix.yaml"), out, "code")
    (tmp_path / "old").rename(tmp_path / "new")
    mix = load_mix(tmp_path / "new" / "mix.yaml")
    again = tokenize(mix, out, "code")
    assert again.chunks_reused == again.chunks_relocated == again.chunks
    meta = [json.loads(m)["path"] for m in pl.read_parquet(out / "code" / "docs.parquet")["meta"]]
    assert meta == [str(tmp_path / "new" / "repo" / f"m{i}.py") for i in range(5)]
    assert_like_a_clean_tokenization(mix, out, tmp_path, "code")


def test_in_an_object_store_a_moved_folders_chunks_are_copied_within_the_store(tmp_path: Path) -> None:
    store = Store(f"memory://weir-moved-{uuid.uuid4().hex}/notes/chunks")  # a real fsspec store that is not local
    tok = load_tokenizer(TokenizerSpec(kind="bytes"), tmp_path)

    def run(mix: Mix) -> TokenizeReport:
        return tokenize_source(
            "notes", mix.sources["notes"], index_source(mix, "notes"), tok, tmp_path / "idx", chunks=store
        )

    first = run(load_mix(tiny(tmp_path / "old")))
    (tmp_path / "old").rename(tmp_path / "new")
    mix = load_mix(tmp_path / "new" / "tiny.yaml")
    again = run(mix)
    assert again.chunks_reused == again.chunks_relocated == first.chunks
    assert sorted(present_keys(store)) == sorted(pl.read_parquet(tmp_path / "idx" / "docs.parquet")["chunk"].unique())
    shutil.copytree(tmp_path / "idx", tmp_path / "out" / "notes")
    assert_like_a_clean_tokenization(mix, tmp_path / "out", tmp_path)
