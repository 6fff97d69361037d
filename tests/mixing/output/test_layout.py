"""``mixing.output.layout.BuildLayout``: every stage's place is a distinct path under ``root``; a local build is
published at ``root`` itself, a build with a ``target`` at the target (its shards and store there, its working
files still under ``root``); ``of`` takes a layout or a folder; the storage options (credentials) take no part in
equality, hashing or ``repr``."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.manifest import MANIFEST
from mixing.output.layout import BuildLayout
from mixing.output.shard_writer import write_shards

NAMES = st.text(st.characters(whitelist_categories=["L", "N"]) | st.sampled_from("-_."), min_size=1).filter(
    lambda s: s not in (".", "..")
)


def paths(layout: BuildLayout, sources: list[str]) -> list[Path]:
    return [
        layout.duckdb,
        layout.tokenizer_dir,
        layout.plan_dir,
        layout.shards_dir,
        layout.manifest,
        *(layout.source_dir(s) for s in sources),
    ]


@given(sources=st.lists(NAMES, max_size=5, unique=True))
def test_every_place_is_distinct_and_under_the_root(sources: list[str]) -> None:
    layout = BuildLayout(Path("/builds/mix"))
    places = paths(layout, sources)
    assert len(set(places)) == len(places)
    assert all(p.is_relative_to(layout.root) and p != layout.root for p in places)
    assert layout.manifest == layout.shards_dir / MANIFEST
    assert {layout.source_dir(s).parent for s in sources} <= {layout.root / "sources"}


def write_three(shards_url: str, storage_options: dict | None = None) -> None:  # type: ignore[type-arg]
    tokens = np.arange(3 * 8, dtype=np.uint16).reshape(3, 8)
    segments = np.array([[0, i, 0, 8] for i in range(3)], np.int64)
    write_shards(shards_url, tokens, np.arange(3), np.arange(4), segments, 2, {}, storage_options=storage_options)


def test_a_local_build_is_published_at_its_root(tmp_path: Path) -> None:
    layout = BuildLayout.of(tmp_path / "b")
    assert layout == BuildLayout(tmp_path / "b") and BuildLayout.of(layout) is layout
    assert layout.url == str(tmp_path / "b") and layout.shards_url == str(layout.shards_dir)
    write_three(layout.shards_url)
    shards = layout.shard_set()
    assert len(shards) == 3 and shards.dir == layout.shards_dir and layout.manifest.exists()
    store = layout.store()
    assert store.local and store.path == layout.root and store.exists(f"shards/{MANIFEST}")


def test_a_build_with_a_target_is_published_there_and_works_under_its_root(tmp_path: Path) -> None:
    target = f"memory://weir-layout-{uuid.uuid4().hex}/mix"
    layout = BuildLayout(tmp_path / "work", target=target, storage_options={"skip_instance_cache": False})
    assert layout.url == target and layout.shards_url == f"{target}/shards"
    assert all(p.is_relative_to(tmp_path / "work") for p in paths(layout, ["web"]))  # the driver's own files
    write_three(layout.shards_url, layout.storage_options)
    assert len(layout.shard_set()) == 3 and layout.shard_set().url == layout.shards_url
    store = layout.store()
    assert not store.local and store.url == target and store.exists(f"shards/{MANIFEST}")
    assert store.storage_options == layout.storage_options
    assert not layout.shards_dir.exists()  # nothing published passed through the working folder


def test_storage_options_are_not_part_of_a_layouts_identity() -> None:
    secret = {"key": "AKIA-SECRET", "secret": "SUPERSECRET"}
    a = BuildLayout(Path("/w"), target="s3://bucket/mix", storage_options=secret)
    b = BuildLayout(Path("/w"), target="s3://bucket/mix")
    assert a == b and hash(a) == hash(b) and "SECRET" not in repr(a)
    assert a != BuildLayout(Path("/w")) and a != BuildLayout(Path("/w"), target="s3://bucket/other")
    with pytest.raises(AttributeError):
        a.root = Path("/elsewhere")  # type: ignore[misc]
