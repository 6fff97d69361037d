"""A source file written between the ``source_index`` stage and the ``documents`` stage (or while the documents stage
reads it) fails the documents stage in one line naming the file, whatever its new size; nothing of it is committed,
and building again indexes it anew: the build is then a fresh build's of the new files. An object rewritten in S3
with the same size (another ETag) is caught alike.

The stages run one by one as ``weir build`` runs them (tests/mixing/test_stages.py); the change happens between
two of them, or inside the reader once the file's first record is read.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest

import mixing.ingest.sources as sources_mod
from contract.manifest import MANIFEST
from mixing import load_mix
from mixing.engine import LOCAL
from mixing.ingest.records import Record
from mixing.ingest.sources import FileChangedError, Listed, index_source, read_records
from mixing.mixfile.mix import Mix, parse_mix
from mixing.output.commit import read_commit
from mixing.output.layout import BuildLayout
from mixing.stages import STAGES, stages_until
from tests.conftest import TINY_MIX, moto_endpoint, write_tiny_sources

NOTE = "notes/n03.txt"


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[Mix, Path]:
    """The tiny mix over its data in ``tmp_path/data``: the mix and the data folder."""
    data = tmp_path / "data"
    write_tiny_sources(data)
    (tmp_path / "tiny.yaml").write_text(TINY_MIX.format(root=data))
    return load_mix(tmp_path / "tiny.yaml"), data


def _run(mix: Mix, layout: BuildLayout, names: list[str]) -> None:
    for stage in STAGES:
        if stage.name in names:
            for partition in stage.partitions(mix):
                stage.run(mix, layout, partition, engine=LOCAL)


def _build(mix: Mix, out: Path) -> BuildLayout:
    layout = BuildLayout(out)
    _run(mix, layout, [s.name for s in STAGES])
    return layout


def _same_size_rewrite(path: Path) -> None:
    """Other bytes of the same length, written a second after the file was (as a writer later in time would)."""
    old, st = path.read_bytes(), path.stat()
    new = old.replace(b"Note", b"NOTE")
    assert new != old and len(new) == len(old)
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def _grow(path: Path) -> None:
    path.write_bytes(path.read_bytes() + b"One sentence more.\n")


@pytest.mark.parametrize("change", [_same_size_rewrite, _grow], ids=["same size", "another size"])
def test_a_file_changed_after_indexing_fails_its_documents_in_one_line_and_a_new_build_reads_it(
    tiny: tuple[Mix, Path], tmp_path: Path, change: Callable[[Path], None]
) -> None:
    mix, data = tiny
    layout = BuildLayout(tmp_path / "out")
    _run(mix, layout, [s.name for s in stages_until("tokenizer")])
    listed = pl.read_parquet(layout.source_dir("notes") / "index.parquet")
    change(data / NOTE)
    with pytest.raises(FileChangedError) as e:
        STAGES[[s.name for s in STAGES].index("documents")].run(mix, layout, "notes", engine=LOCAL)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{data / NOTE}: changed since the source index listed it"), msg
    assert "build again" in msg
    assert read_commit(layout.store(), "documents", "notes") is None, "the failed stage committed nothing"
    assert not (layout.source_dir("notes") / "docs.parquet").exists()
    # the index is as it was listed: the failure never let tokens of other bytes stand beside it
    assert pl.read_parquet(layout.source_dir("notes") / "index.parquet").equals(listed)

    _run(mix, layout, [s.name for s in STAGES])  # building again indexes the file anew
    fresh = _build(mix, tmp_path / "fresh")
    assert layout.store().read(f"shards/{MANIFEST}") == fresh.store().read(f"shards/{MANIFEST}")
    for source in mix.sources:
        ours = pl.read_parquet(layout.source_dir(source) / "docs.parquet")
        assert ours.equals(pl.read_parquet(fresh.source_dir(source) / "docs.parquet")), source


def test_a_file_written_while_it_is_read_fails_its_documents(
    tiny: tuple[Mix, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mix, _ = tiny
    layout = BuildLayout(tmp_path / "out")
    _run(mix, layout, [s.name for s in stages_until("tokenizer")])
    real = sources_mod.read_file

    def appending(path: str, *args: Any, **kwargs: Any) -> Iterator[Record]:
        for i, rec in enumerate(real(path, *args, **kwargs)):
            if i == 0 and path.endswith("qa.jsonl"):  # a writer appends once the reader is under way
                with open(path, "a") as f:
                    f.write('{"q": "late", "a": "0"}\n')
            yield rec

    monkeypatch.setattr(sources_mod, "read_file", appending)
    with pytest.raises(FileChangedError, match=r"^\S+/qa\.jsonl: changed since the source index listed it \(\d+ "):
        STAGES[[s.name for s in STAGES].index("documents")].run(mix, layout, "qa", engine=LOCAL)
    assert read_commit(layout.store(), "documents", "qa") is None


def test_a_file_touched_but_unchanged_is_read_as_listed_when_the_index_is_fresh(tiny: tuple[Mix, Path]) -> None:
    # the check compares the file with its listing, nothing else: indexed after the touch, it reads as always
    mix, data = tiny
    os.utime(data / NOTE, ns=(0, 10**18))
    (row,) = index_source(mix, "notes").filter(pl.col("path").str.ends_with(NOTE)).iter_rows(named=True)
    (rec,) = read_records(Listed.of(row), mix.sources["notes"])
    assert rec.text is not None and rec.text.startswith("Note 3.")


MIX = """
name: s3mix
tokenizer: {kind: bytes}
sequence: {length: 64, global_batch: 2}
sources:
  qa: {uri: "s3://changed/qa/*.jsonl", format: jsonl, template: "{q} {a}"}
curriculum:
  - {phase: p, steps: 2, mixture: {qa: 1.0}}
"""


def test_an_object_rewritten_with_the_same_size_after_indexing_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    import s3fs

    with moto_endpoint() as url:
        for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        opts: dict[str, Any] = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        fs = s3fs.S3FileSystem(**opts, skip_instance_cache=True)
        fs.mkdir("changed")
        fs.pipe("changed/qa/a.jsonl", b'{"q": "one", "a": "1"}\n')
        mix = parse_mix(MIX)
        (row,) = index_source(mix, "qa", opts).iter_rows(named=True)  # lists (and caches) the object's details
        spec = mix.sources["qa"]
        assert [r.text for r in read_records(Listed.of(row), spec, opts)] == ["one 1"]
        fs.pipe("changed/qa/a.jsonl", b'{"q": "two", "a": "2"}\n')  # same length, another ETag
        with pytest.raises(FileChangedError, match=r"^s3://changed/qa/a\.jsonl: changed .*\(the same size, "):
            list(read_records(Listed.of(row), spec, opts))
        fs.pipe("changed/qa/a.jsonl", b'{"q": "three", "a": "3"}\n')
        with pytest.raises(FileChangedError, match=r"\(23 bytes listed, 25 now\)"):
            list(read_records(Listed.of(row), spec, opts))
