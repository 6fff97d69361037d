"""mixing.mixfile.pathrule: one rule for every path a mix file names (relative to the mix file, placeholders
expanded, normalized, idempotent; URLs as written)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mixing.mixfile.pathrule import is_url, resolve_path


@pytest.mark.parametrize(
    ("written", "resolved"),
    [
        ("x/*.txt", "/m/d/x/*.txt"),  # relative: from the mix file's folder
        ("{mix_dir}/../e/x.json", "/m/e/x.json"),
        ("/m/./e//x.json", "/m/e/x.json"),
        ("/data/notes/*.txt", "/data/notes/*.txt"),  # already normal: the same string
        ("s3://bucket//a/../b/*.jsonl", "s3://bucket//a/../b/*.jsonl"),  # a URL as written
        ("{env_DATA}/../x", "{env_DATA}/../x"),  # shown: a `..` never cancels a variable's part
        ("~/t.json", str(Path.home() / "t.json")),
    ],
)
def test_resolve_path_is_one_rule(written: str, resolved: str) -> None:
    assert resolve_path(written, "/m/d") == resolved
    assert resolve_path(resolved, "/elsewhere") == resolved  # idempotent


def test_resolve_path_expands_variables_then_normalizes() -> None:
    assert resolve_path("{env_DATA}/../x/*.txt", "/m/d", {"DATA": "/srv/data/"}) == "/srv/x/*.txt"
    assert resolve_path("{env_DATA}/x", "/m/d", {"DATA": "s3://b/p"}) == "s3://b/p/x"


@given(st.lists(st.sampled_from(["a", "b", ".", "..", "", "c.txt", "*"]), min_size=1, max_size=8))
@example(["", "", "a"])  # "//a": POSIX keeps a leading "//"
def test_a_resolved_local_path_is_absolute_normal_and_a_fixed_point(parts: list[str]) -> None:
    written = "/".join(parts)
    once = resolve_path(written, "/m/d")
    body = once.lstrip("/")  # POSIX keeps a leading "//" (os.path.normpath): what follows is normal
    assert once.startswith("/") and "/./" not in f"/{body}/" and "//" not in body
    assert ".." not in once.split("/")[1:] or once.split("/")[1] == ".."  # only a root's own .. may stay
    assert resolve_path(once, "/anywhere") == once


@pytest.mark.parametrize(("path", "url"), [("s3://b/k", True), ("file:///x", True), ("/x/y", False), ("a:b", False)])
def test_is_url(path: str, url: bool) -> None:
    assert is_url(path) is url
