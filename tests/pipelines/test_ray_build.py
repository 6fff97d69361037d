"""``weir build --engine ray`` on a real two-node Ray cluster (issue 13): into S3 (a real ``moto_server`` that
checks credentials) and into a local folder, the build is the local engine's byte for byte; a loader reads the S3
build as the local one; an incremental rebuild tokenizes only the chunk of the file that changed; a mix whose URIs
name a ``{env_NAME}`` that only the driver has (the workers' environment is the cluster's) builds as locally.

The drivers are ``weir build`` subprocesses; the corpus, its reference build and the comparisons are in
``tests/ray_builds.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import polars as pl
import pytest

from contract.shards import ShardSet
from contract.store import Store
from loaders import PackedDataset, Reading, World
from tests.ray_builds import Driver, RayBuilds, assert_same_build, build_reference, ray_builds
from tests.ray_cluster import LocalRayCluster

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rb(ray_cluster: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayBuilds]:
    with ray_builds(ray_cluster, tmp_path_factory) as builds:
        yield builds


@pytest.fixture(scope="module")
def s3_build(rb: RayBuilds) -> Store:
    """The corpus built on the Ray cluster into ``s3://…/ray``."""
    return rb.build(rb.url("ray"))


def _documents_metadata() -> dict[str, dict[str, object]]:
    """The newest materialization's metadata values of each ``documents`` partition, from the session's DAGSTER_HOME
    (where the drivers record their runs)."""
    with dg.DagsterInstance.get() as instance:
        records = instance.fetch_materializations(dg.AssetKey(["raymix", "documents"]), limit=1000).records
    newest: dict[str, dict[str, object]] = {}
    for r in sorted(records, key=lambda r: r.timestamp):
        m = r.asset_materialization
        assert m is not None and m.partition is not None
        newest[m.partition] = {k: v.value for k, v in m.metadata.items()}
    return newest


def _reference_chunks(rb: RayBuilds) -> dict[str, int]:
    return {s.name: len(list((s / "chunks").iterdir())) for s in (rb.reference / "sources").iterdir()}


def test_a_ray_build_into_s3_is_the_local_build_byte_for_byte(rb: RayBuilds, s3_build: Store) -> None:
    assert_same_build(s3_build, rb.reference)
    # every source's chunks were submitted at once, before the first source's run, and each run collected its own:
    # none counted as reused although a listing may already have shown it
    chunks = _reference_chunks(rb)
    log = next(rb.logs.glob("*-ray.log")).read_text()
    assert f"documents: {sum(chunks.values())} tasks of every source started on ray" in log, log
    assert log.index("tasks of every source started") < log.index("documents [prose]") < log.index("documents [qa]")
    md = _documents_metadata()
    assert {s: (m["chunks"], m["chunks_reused"]) for s, m in md.items()} == {s: (n, 0) for s, n in chunks.items()}


def test_weir_inspect_reads_the_s3_build_and_dagster_recorded_the_engine(rb: RayBuilds, s3_build: Store) -> None:
    weir = [sys.executable, "-m", "pipelines.cli", "inspect", "--json"]
    env = {**os.environ, **rb.env}
    remote = subprocess.run([*weir, s3_build.url], capture_output=True, text=True, env=env, cwd=ROOT)
    assert remote.returncode == 0, remote.stderr  # every shard hashed in S3, the plan from the working folder
    here = subprocess.run([*weir, str(rb.reference)], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    assert json.loads(remote.stdout) == json.loads(here.stdout)

    with dg.DagsterInstance.get() as instance:  # the session's DAGSTER_HOME, where the drivers recorded their runs
        records = instance.fetch_materializations(dg.AssetKey(["raymix", "documents"]), limit=1000).records
    assert records
    for r in records:  # the documents asset's metadata names the engine and the cluster's workers
        md = r.asset_materialization.metadata  # type: ignore[union-attr]
        assert md["engine"].value == "ray" and md["workers"].value == 2, md  # type: ignore[attr-defined]


def test_a_ray_build_into_a_local_folder_is_the_local_build_byte_for_byte(rb: RayBuilds, tmp_path: Path) -> None:
    assert_same_build(rb.build(str(tmp_path / "build")), rb.reference)


def test_the_loader_reads_the_s3_build_as_the_local_one(rb: RayBuilds, s3_build: Store, tmp_path: Path) -> None:
    # the build root's URL and its shards folder's: the loader takes either
    for rank, url in enumerate([s3_build.url, f"{s3_build.url}/shards"]):
        world = World(rank, 2)
        local = PackedDataset(rb.reference, world=world, reading=Reading(cache_dir=tmp_path / "local"))
        remote = PackedDataset(
            url, world=world, reading=Reading(cache_dir=tmp_path / "s3", storage_options=rb.s3.options)
        )
        assert remote.build_id == local.build_id
        items = 0
        for a, b in zip(local, remote, strict=True):
            assert a.keys() == b.keys()
            for k, v in a.items():
                assert v.equal(b[k]) if hasattr(v, "equal") else v == b[k], f"item {items} of rank {rank}: {k}"
            items += 1
        assert items == len(local.shards) // 2


def _chunk_objects(store: Store) -> dict[str, tuple[object, str]]:
    """Every object of every chunk, ``<source>/chunks/<key>/<file>`` → (LastModified, ETag)."""
    found = store.fs.find(store.key("sources"), detail=True)
    prefix = store.key("sources") + "/"
    return {p.removeprefix(prefix): (i["LastModified"], i["ETag"]) for p, i in found.items() if "/chunks/" in p}


def _keys(objects: dict[str, tuple[object, str]]) -> set[str]:
    return {p.rsplit("/", 1)[0] for p in objects}


def _chunk_of(build: Path, file: Path) -> str:
    """``prose/chunks/<key>``: the chunk holding the document of ``file`` in the local build ``build``."""
    docs = pl.read_parquet(build / "sources" / "prose" / "docs.parquet")
    return "prose/chunks/" + docs.filter(pl.col("file") == str(file))["chunk"].item()


def test_an_incremental_ray_rebuild_tokenizes_only_the_changed_files_chunk(
    rb: RayBuilds, s3_build: Store, tmp_path: Path
) -> None:
    # a previous build of the same mix in its own root (a copy of the Ray build), so other tests keep theirs
    s3_build.fs.copy(s3_build.root, f"{s3_build.root.rsplit('/', 1)[0]}/incremental", recursive=True)
    store = rb.store(rb.url("incremental"))
    before = _chunk_objects(store)
    assert _keys(before) == {
        f"{p.parent.parent.name}/chunks/{p.name}" for p in (rb.reference / "sources").glob("*/chunks/*")
    }
    changed = rb.mix.parent / "data" / "prose" / "p0100.txt"
    old_key = _chunk_of(rb.reference, changed)
    original, stat = changed.read_bytes(), changed.stat()
    try:  # the corpus is the module's: it is put back as it was (bytes and mtime, hence its fingerprint)
        changed.write_bytes(original + b"one sentence more.\n")
        rb.build(store.url)
        clean = build_reference(rb.mix, tmp_path / "clean")
    finally:
        changed.write_bytes(original)
        os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    new_key = _chunk_of(clean, changed)
    after = _chunk_objects(store)
    assert _keys(after) - _keys(before) == {new_key}, "exactly one chunk is new: the changed file's"
    assert _keys(before) - _keys(after) == {old_key}, "the changed file's old chunk is gone"
    kept = {p: v for p, v in before.items() if not p.startswith(old_key + "/")}
    assert {p: after.get(p) for p in kept} == kept, "every other chunk's objects are the ones the first build wrote"
    assert_same_build(store, clean)
    # submitted ahead: one chunk to tokenize, the others to check; each source's run counted them as the local one
    log = next(rb.logs.glob("*-incremental.log")).read_text()
    assert f"documents: {sum(_reference_chunks(rb).values())} tasks of every source started on ray" in log, log
    md = _documents_metadata()
    assert md["prose"]["chunks"] == md["prose"]["chunks_reused"] + 1  # type: ignore[operator]
    assert md["qa"]["chunks"] == md["qa"]["chunks_reused"]


def test_a_ray_build_whose_uri_names_an_env_variable_the_workers_lack_is_the_local_build(
    rb: RayBuilds, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers' environment is the cluster's, taken when it started: WEIR_TEST_RAY_DATA is only the driver's.
    var, value = "WEIR_TEST_RAY_DATA", str(rb.mix.parent / "data")
    assert var not in os.environ, "the cluster's workers would have it"
    text = rb.mix.read_text().replace(value, f"{{env_{var}}}").replace("name: raymix", "name: envmix")
    assert text.count(f"{{env_{var}}}/") == 2
    mix = tmp_path / "envmix.yaml"
    mix.write_text(text)
    log = rb.logs / "build-envmix.log"
    Driver(mix, str(tmp_path / "ray"), log, {**rb.env, var: value}, rb.cluster).wait()
    monkeypatch.setenv(var, value)
    local = build_reference(mix, tmp_path / "local")
    assert_same_build(Store(tmp_path / "ray"), local)
    docs = pl.read_parquet(tmp_path / "ray" / "sources" / "prose" / "docs.parquet")
    assert docs["file"].str.starts_with(f"{{env_{var}}}/prose/").all(), "the documents name the files as shown"
    # the same shards, token for token, as the mix that names the folder itself
    for shard in ShardSet(rb.reference / "shards").manifest.shards:
        for f in shard.files.both():
            ours, theirs = (root / "shards" / f.name for root in (tmp_path / "ray", rb.reference))
            assert ours.read_bytes() == theirs.read_bytes(), f.name
    assert value not in log.read_text()
    written = [p for p in (tmp_path / "ray").rglob("*") if p.is_file() and p.suffix not in (".parquet", ".duckdb")]
    assert written and not [p for p in written if value.encode() in p.read_bytes()], "a file shows the value"
