"""Source index: globs and code folders, fingerprints that change exactly when a file changes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mixing.ingest.sources import SourceIndexError, index_source
from mixing.mixfile.mix import parse_mix

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
