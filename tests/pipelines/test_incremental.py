"""Incremental rebuilds: one changed file re-tokenizes only its chunk, and the result equals a clean build."""

from __future__ import annotations

import json
import os
from pathlib import Path

import dagster as dg
import polars as pl

from mixing import load_mix
from mixing.output.layout import BuildLayout
from pipelines.build import build_mix
from pipelines.kept_work import reuse_previous
from tests.conftest import TINY_MIX, write_tiny_sources


def build(mix_path: Path, out: Path, previous: Path | None = None) -> BuildLayout:
    mix = load_mix(mix_path)
    if previous is not None:
        reuse_previous(previous, out)
    build_mix(mix, out, say=lambda _s: None)
    return BuildLayout(out)


def chunk_inodes(layout: BuildLayout, source: str) -> dict[str, int]:
    d = layout.source_dir(source) / "chunks"
    return {k: (d / k / "tokens.bin").stat().st_ino for k in os.listdir(d)}


def same_outputs(a: BuildLayout, b: BuildLayout, sources: list[str]) -> None:
    for s in sources:
        quarantine = a.source_dir(s) / "quarantine.jsonl"
        assert quarantine.read_bytes() == (b.source_dir(s) / "quarantine.jsonl").read_bytes()
        docs = pl.read_parquet(a.source_dir(s) / "docs.parquet")
        assert docs.equals(pl.read_parquet(b.source_dir(s) / "docs.parquet"))
        for key in docs["chunk"].unique().to_list():  # the tokens the index points at
            f = f"chunks/{key}/tokens.bin"
            assert (a.source_dir(s) / f).read_bytes() == (b.source_dir(s) / f).read_bytes(), (s, f)
    assert json.loads(a.manifest.read_text()) == json.loads(b.manifest.read_text())
    for shard in sorted(a.shards_dir.glob("shard-*")):
        assert shard.read_bytes() == (b.shards_dir / shard.name).read_bytes(), shard.name


def test_one_changed_file_rebuilds_only_its_chunk_and_equals_a_clean_build(tiny_mix_path: Path, tmp_path: Path) -> None:
    # A trained BPE whose sample is the first few hundred bytes of each source (sorted files): the last
    # note is outside the sample, so changing it must keep the tokenizer and every other chunk.
    text = tiny_mix_path.read_text().replace("{kind: bytes}", "{kind: bpe, vocab_size: 300, sample_bytes: 400}")
    tiny_mix_path.write_text(text)
    first = build(tiny_mix_path, tmp_path / "first")
    notes = sorted((tiny_mix_path.parent / "data" / "notes").glob("*.txt"))
    notes[-1].write_text(notes[-1].read_text() + " and one more sentence.\n")

    second = build(tiny_mix_path, tmp_path / "second", previous=first.root)
    clean = build(tiny_mix_path, tmp_path / "clean")
    same_outputs(second, clean, ["notes", "qa"])
    assert (first.tokenizer_dir / "tokenizer.json").read_bytes() == (
        second.tokenizer_dir / "tokenizer.json"
    ).read_bytes()
    before, after = chunk_inodes(first, "notes"), chunk_inodes(second, "notes")
    changed = set(after) - set(before)
    assert len(changed) == 1, "exactly the changed file's chunk is re-tokenized"
    assert all(after[k] == before[k] for k in set(after) & set(before)), "the others are reused, not rewritten"
    assert chunk_inodes(first, "qa") == chunk_inodes(second, "qa")

    # A file inside the tokenizer's sample changes the tokenizer: everything is (legitimately) redone.
    notes[0].write_text("A different first note changes the BPE sample.\n")
    third = build(tiny_mix_path, tmp_path / "third", previous=second.root)
    assert not set(chunk_inodes(third, "qa")) & set(chunk_inodes(second, "qa"))
    same_outputs(third, build(tiny_mix_path, tmp_path / "clean2"), ["notes", "qa"])


def documents_counts(instance: dg.DagsterInstance) -> dict[str, tuple[int, int]]:
    """(chunks, chunks reused) of each source's newest ``documents`` materialization in ``instance``."""
    records = instance.fetch_materializations(dg.AssetKey(["tiny", "documents"]), limit=100).records
    newest: dict[str, tuple[int, int]] = {}
    for r in sorted(records, key=lambda r: r.timestamp):
        m = r.asset_materialization
        assert m is not None and m.partition is not None
        chunks, reused = m.metadata["chunks"].value, m.metadata["chunks_reused"].value
        assert isinstance(chunks, int) and isinstance(reused, int)
        newest[m.partition] = (chunks, reused)
    return newest


def test_a_mix_moved_with_its_data_reuses_every_chunk_and_builds_the_same_shards(tmp_path: Path) -> None:
    # The mix names its data relative to itself, as a mix carried with its data does.
    old = tmp_path / "old"
    write_tiny_sources(old / "data")
    (old / "tiny.yaml").write_text(TINY_MIX.format(root="data"))
    first = build(old / "tiny.yaml", tmp_path / "first")
    new = tmp_path / "elsewhere" / "new"
    new.parent.mkdir()
    old.rename(new)  # the mix and its data, moved together

    with dg.DagsterInstance.ephemeral() as instance:
        reuse_previous(first.root, tmp_path / "second")
        build_mix(load_mix(new / "tiny.yaml"), tmp_path / "second", say=lambda _s: None, instance=instance)
        counts = documents_counts(instance)
    second = BuildLayout(tmp_path / "second")
    assert counts and all(reused == chunks for chunks, reused in counts.values()), counts  # 0 tokenized
    for s in ("notes", "qa"):
        before = set(chunk_inodes(first, s).values())
        assert set(chunk_inodes(second, s).values()) <= before, "every chunk's tokens are the first build's"
        files = pl.read_parquet(second.source_dir(s) / "docs.parquet")["file"].unique().to_list()
        assert files and all(f.startswith(str(new / "data")) for f in files), files  # where the files are now
    quarantined = [json.loads(x) for x in second.source_dir("qa").joinpath("quarantine.jsonl").read_text().splitlines()]
    assert [q["file"] for q in quarantined] == [str(new / "data" / "qa.jsonl")]
    for f in sorted(first.shards_dir.iterdir()):  # the build is a function of the contents, not of where they are
        assert f.read_bytes() == (second.shards_dir / f.name).read_bytes(), f.name
