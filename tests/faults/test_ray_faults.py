"""SIGKILL during Ray builds into S3 (issue 13), on a real two-node Ray cluster and a real ``moto_server``.

One build root goes through three builds: the first one's driver is killed while tokenizing; the next one
completes while a worker is killed inside a tokenize task and another inside a shard task; a third one's driver
is killed while rewriting the shards of that complete build, and a fourth completes it. After each kill, every
commit record verifies and nothing else is committed; each completed build is the local engine's byte for byte.

The drivers are ``weir build`` subprocesses; the corpus, its reference build and the checks are in
``tests/ray_builds.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contract.manifest import MANIFEST
from contract.store import Store
from pipelines.lease import LEASE_NAME
from tests.ray_builds import RayBuilds, assert_same_build, commit_state, kill_worker, ray_builds, settle, wait_for
from tests.ray_cluster import LocalRayCluster

INDEXED = {f"commits/source_index/{s}.json" for s in ("prose", "qa")} | {"commits/tokenizer.json"}
PLANNED = (
    INDEXED
    | {f"commits/documents/{s}.json" for s in ("prose", "qa")}
    | {
        "commits/length_stats.json",
        "commits/plan.json",
    }
)


@pytest.fixture(scope="module")
def rb(ray_cluster: LocalRayCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayBuilds]:
    with ray_builds(ray_cluster, tmp_path_factory) as builds:
        yield builds


@pytest.fixture(scope="module")
def killed_while_tokenizing(rb: RayBuilds) -> tuple[Store, dict[str, list[str]]]:
    """The first build of ``s3://…/faults``, its driver killed as soon as its first chunk is complete: the root,
    and its :func:`commit_state` once Ray has ended the dead driver's tasks."""
    store = rb.store(rb.url("faults"))
    driver = rb.start(store.url)
    wait_for("a complete chunk", lambda: any(p.endswith("/report.json") for p in store.walk("sources")), driver)
    driver.kill()
    settle(rb.cluster)
    assert store.exists(LEASE_NAME), "a killed driver leaves its lease, for the next driver to take over"
    return store, commit_state(store)


@pytest.fixture(scope="module")
def rebuilt(rb: RayBuilds, killed_while_tokenizing: tuple[Store, dict[str, list[str]]]) -> tuple[Store, list[int]]:
    """The next build of that root, to its end, while a worker is killed inside a ``tokenize_chunk`` task and then
    another inside a ``write_shard`` task: the root and the killed workers' pids."""
    store, _ = killed_while_tokenizing
    driver = rb.start(store.url)
    try:
        killed = [kill_worker(rb.cluster, task, driver) for task in ("tokenize_chunk", "write_shard")]
        driver.wait()
    finally:
        if driver.running():
            driver.kill()
    assert "took over the lease of" in driver.log.read_text(), "the killed driver's lease, once expired"
    return store, killed


def test_a_driver_killed_while_tokenizing_leaves_only_whole_stages_committed(
    killed_while_tokenizing: tuple[Store, dict[str, list[str]]],
) -> None:
    _, state = killed_while_tokenizing
    assert state == {name: [] for name in INDEXED}


def test_workers_killed_while_tokenizing_and_writing_shards_leave_the_build_identical(
    rb: RayBuilds, rebuilt: tuple[Store, list[int]]
) -> None:
    store, killed = rebuilt
    assert len(set(killed)) == 2
    assert_same_build(store, rb.reference)
    assert not store.exists(LEASE_NAME), "the build released the root's lease"


def _shard_times(store: Store) -> dict[str, object]:
    """Shard file → LastModified, in one listing."""
    found = store.fs.ls(store.key("shards"), detail=True)
    return {i["name"].rsplit("/", 1)[1]: i["LastModified"] for i in found if "/shard-" in i["name"]}


def test_a_driver_killed_while_rewriting_shards_leaves_only_whole_stages_committed_and_the_next_build_completes(
    rb: RayBuilds, rebuilt: tuple[Store, list[int]]
) -> None:
    store, _ = rebuilt
    written = _shard_times(store)
    assert written, "the complete build has shards"
    driver = rb.start(store.url)
    wait_for("a shard file rewritten", lambda: _shard_times(store).items() - written.items() != set(), driver)
    driver.kill()
    settle(rb.cluster)
    assert not store.exists(f"shards/{MANIFEST}"), "the kill landed after the last shard: kill earlier"
    assert commit_state(store) == {name: [] for name in PLANNED}
    rb.build(store.url)
    assert_same_build(store, rb.reference)
