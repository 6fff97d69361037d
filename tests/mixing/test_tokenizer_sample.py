"""``mixing.tokenizer_sample``: an equal share of ``tokenizer.sample_bytes`` per source, sources sorted, files in
index order, records cut where the share fills; a file past the full share is never read, nor a path the index
skipped; the same files give the same sample."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import mixing.tokenizer_sample as sample_mod
from mixing import stages
from mixing.mixfile.mix import Mix, parse_mix
from mixing.output.layout import BuildLayout
from mixing.tokenizer_sample import tokenizer_sample


def indexed(tmp_path: Path, sample_bytes: int, files: dict[str, list[str]]) -> tuple[Mix, BuildLayout]:
    """A mix of text sources (one folder each, one record per file, named in order), each source indexed."""
    for source, texts in files.items():
        (tmp_path / source).mkdir()
        for i, text in enumerate(texts):
            (tmp_path / source / f"f{i:02d}.txt").write_text(text)
    mix = parse_mix(
        f"name: m\ntokenizer: {{kind: bytes, sample_bytes: {sample_bytes}}}\n"
        "sequence: {length: 64, global_batch: 1}\nsources:\n"
        + "".join(f"  {s}: {{uri: '{tmp_path / s}/*.txt', format: text}}\n" for s in files)
        + f"curriculum:\n  - {{phase: p, steps: 1, mixture: {{{next(iter(files))}: 1}}}}\n"
    )
    layout = BuildLayout(tmp_path / "build")
    for source in files:
        stages.index(mix, layout, source)
    return mix, layout


def opened(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the sample reads from here on, in order (an unreadable one would read as an error record)."""
    paths: list[str] = []
    real = sample_mod.read_records

    def recording(path: str, *args: Any) -> Iterator[Any]:
        paths.append(Path(path).name)
        return real(path, *args)

    monkeypatch.setattr(sample_mod, "read_records", recording)
    return paths


def test_each_source_gives_an_equal_share_sorted_and_in_index_order(tmp_path: Path) -> None:
    mix, layout = indexed(tmp_path, 20, {"zz": ["z" * 4, "y" * 30], "aa": ["a" * 3, "b" * 3, "c" * 30]})
    sample = list(tokenizer_sample(mix, layout))
    assert "".join(sample) == "aaabbb" + "c" * 4 + "zzzz" + "y" * 6
    assert list(tokenizer_sample(mix, layout)) == sample, "the same files give the same sample"


def test_a_source_short_of_its_share_gives_all_its_text(tmp_path: Path) -> None:
    mix, layout = indexed(tmp_path, 100, {"a": ["abc"], "b": ["x" * 80]})
    assert "".join(tokenizer_sample(mix, layout)) == "abc" + "x" * 50


def test_a_file_past_the_full_share_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mix, layout = indexed(tmp_path, 20, {"a": ["a" * 10, "late"], "b": ["b" * 4, "c" * 9, "later"]})
    paths = opened(monkeypatch)
    (tmp_path / "a" / "f01.txt").write_text("changed")  # after the share filled: the sample stays as it was
    assert list(tokenizer_sample(mix, layout)) == ["a" * 10, "b" * 4, "c" * 6]
    assert paths == ["f00.txt", "f00.txt", "f01.txt"]


def test_a_path_the_index_skipped_is_never_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f00.txt").symlink_to(tmp_path / "nowhere")  # dangling: indexed as skipped
    (tmp_path / "a" / "f01.txt").write_text("abc")
    mix = parse_mix(
        "name: m\ntokenizer: {kind: bytes, sample_bytes: 100}\nsequence: {length: 64, global_batch: 1}\n"
        f"sources:\n  a: {{uri: '{tmp_path / 'a'}/*.txt', format: text}}\n"
        "curriculum:\n  - {phase: p, steps: 1, mixture: {a: 1}}\n"
    )
    layout = BuildLayout(tmp_path / "build")
    index = stages.index(mix, layout, "a")
    assert index["skipped"].null_count() == 1, "the dangling link is listed, skipped"
    paths = opened(monkeypatch)
    assert list(tokenizer_sample(mix, layout)) == ["abc"]
    assert paths == ["f01.txt"]
