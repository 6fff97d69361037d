"""Builds of one corpus on a real Ray cluster, for the Ray tests (tests/pipelines/test_ray_build.py,
tests/faults/test_ray_faults.py): the corpus and its mix, the reference build (local engine, in this process),
``weir build`` as a subprocess driver, and the checks that compare a build in any root with the reference.

The corpus (:func:`write_corpus`, 7 MB of text in 320 files) makes about 15 chunks (a file ends its chunk when its
path's hash says so, one in :data:`CHUNK_FILES`), each of which a worker tokenizes and uploads in 0.05 to 1.5 s
(median 0.2 s) on 2 busy cores, and 5 shards of :data:`SHARD_SEQUENCES` sequences (the shard size and the files per
chunk are lowered in every build of these tests, the driver's included: :data:`DRIVER`), each of which a worker
gathers from the chunks with one ranged read
per document piece in 0.8 to 1.5 s from ``moto_server``. :func:`kill_worker` kills a worker while it is titled
with the task and waits for Ray to report that it died inside a task, so a kill that finds the task just ended is
not taken for one inside it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from contract.manifest import MANIFEST
from contract.shards import ShardSet
from contract.store import Store
from mixing import load_mix
from mixing.engine import LOCAL
from mixing.output.commit import Commit, committed, verify
from mixing.output.layout import BuildLayout
from mixing.stages import STAGES
from tests.conftest import ROOT, S3, S3_BUCKET, s3_endpoint
from tests.ray_cluster import LocalRayCluster

__all__ = [
    "Driver",
    "RayBuilds",
    "assert_same_build",
    "build_reference",
    "commit_state",
    "kill_worker",
    "ray_builds",
    "settle",
    "wait_for",
]

SEQ_LEN = 256  # the mix's sequence length
SHARD_SEQUENCES = 64
CHUNK_FILES = 32  # files per chunk on average (the default is larger): ~15 chunks, so that workers can be killed in one
TASKS = ("tokenize_chunk", "verify_chunk", "write_shard")  # the Ray tasks a build runs
# `weir build` with shards of SHARD_SEQUENCES sequences (the jobs are cut in the driver, so patching it is enough)
DRIVER = (
    f"import sys, mixing.pack.packed as p, mixing.ingest.chunks as c; p._SHARD_TOKENS = {SHARD_SEQUENCES * SEQ_LEN}; "
    f"c._GROUP = {CHUNK_FILES}; "
    "from pipelines.cli import app; app(sys.argv[1:])"
)
MIX = """\
name: raymix
seed: 11
tokenizer: {kind: bytes}
sequence: {length: 256, global_batch: 8}
sources:
  prose: {uri: "ROOT/prose/*.txt", format: text, max_epochs: 20}
  qa:    {uri: "ROOT/qa/*.jsonl", format: jsonl, template: "Q: {q} A: {a}", max_epochs: 20}
curriculum:
  - {phase: first, steps: 20, mixture: {prose: 0.7, qa: 0.3}}
  - {phase: second, steps: 20, mixture: {prose: 0.3, qa: 0.7}}
"""
# what a build keeps in its local working folder and never publishes: DuckDB's tables, the packed_shards
# asset's figures (which the reference, built without Dagster, lacks)
LOCAL_ONLY = {"weir.duckdb", "report.json"}


def write_corpus(root: Path, seed: int = 3) -> Path:
    """256 text files (100 to 6,000 words) and 64 jsonl files (300 records) of random words under ``root/data``,
    and ``root/mix.yaml`` that mixes them (40 steps of 8 × 256 tokens); returns the mix file. Deterministic."""
    rng = np.random.default_rng(seed)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    words = np.array(["".join(rng.choice(letters, size=int(k))) for k in rng.integers(2, 9, size=2000)])
    data = root / "data"
    (data / "prose").mkdir(parents=True)
    (data / "qa").mkdir()
    for i in range(256):
        text = " ".join(words[rng.integers(0, len(words), size=int(rng.integers(100, 6000)))])
        (data / "prose" / f"p{i:04d}.txt").write_text(text + "\n")
    for i in range(64):
        records = [
            json.dumps({"q": " ".join(words[rng.integers(0, len(words), size=int(rng.integers(3, 30)))]), "a": str(r)})
            for r in range(300)
        ]
        (data / "qa" / f"q{i:04d}.jsonl").write_text("\n".join(records) + "\n")
    mix = root / "mix.yaml"
    mix.write_text(MIX.replace("ROOT", str(data)))
    return mix


def build_reference(mix_path: Path, out: Path) -> Path:
    """Build the mix into the local folder ``out`` on the local engine, in this process (the stages one after
    another, as ``weir build`` runs them, without Dagster), with the shard size of :data:`DRIVER`; return ``out``."""
    import mixing.ingest.chunks as chunks
    import mixing.pack.packed as packed

    mix = load_mix(mix_path)
    layout = BuildLayout(out)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packed, "_SHARD_TOKENS", SHARD_SEQUENCES * SEQ_LEN)
        mp.setattr(chunks, "_GROUP", CHUNK_FILES)
        for stage in STAGES:
            for partition in stage.partitions(mix):
                stage.run(mix, layout, partition, engine=LOCAL)
    return out


@dataclass(frozen=True)
class RayBuilds:
    """What a test module of Ray builds shares (:func:`ray_builds`): the cluster, an S3 endpoint, the corpus's mix
    file, its reference build, the environment of a driver (S3 settings, its own working folders) and a folder for
    the drivers' logs."""

    cluster: LocalRayCluster
    s3: S3
    mix: Path
    reference: Path
    env: dict[str, str]
    logs: Path

    def url(self, name: str) -> str:
        """The build root ``name`` in the endpoint's bucket."""
        return f"s3://{S3_BUCKET}/{name}"

    def store(self, out: str) -> Store:
        """The build root ``out`` (a URL of this endpoint, or a local folder)."""
        return Store.open(out, self.s3.options if "://" in out else None)

    def start(self, out: str) -> Driver:
        """``weir build`` of the corpus into ``out`` on the cluster, started."""
        log = self.logs / f"build-{len(list(self.logs.iterdir())):02d}-{Path(out).name}.log"
        return Driver(self.mix, out, log, self.env, self.cluster)

    def build(self, out: str) -> Store:
        """``weir build`` of the corpus into ``out`` on the cluster, to its end; the build root."""
        self.start(out).wait()
        return self.store(out)


@contextmanager
def ray_builds(cluster: LocalRayCluster, tmp: pytest.TempPathFactory) -> Iterator[RayBuilds]:
    """A module's :class:`RayBuilds`: a fresh S3 endpoint (stopped on exit), the corpus and its reference build
    in temporary folders; drivers record their Dagster runs in the session's DAGSTER_HOME."""
    with s3_endpoint() as s3:
        mix = write_corpus(tmp.mktemp("corpus"))
        reference = build_reference(mix, tmp.mktemp("reference") / "build")
        # a killed driver's lease of its root expires after WEIR_LEASE_TTL s, and the next driver (--wait) takes it over
        env = {**s3.env(), "WEIR_WORK_DIR": str(tmp.mktemp("work")), "WEIR_LEASE_TTL": "3"}
        yield RayBuilds(cluster, s3, mix, reference, env, tmp.mktemp("logs"))


class Driver:
    """``weir build MIX --out OUT --wait --engine ray`` on ``cluster`` (shards of :data:`SHARD_SEQUENCES`) in a
    subprocess, its output in ``log``; ``env`` adds to this process's environment (which holds DAGSTER_HOME and
    Ray's settings)."""

    def __init__(self, mix: Path, out: str, log: Path, env: dict[str, str], cluster: LocalRayCluster) -> None:
        engine = ["--engine", "ray", "--ray-address", cluster.address]
        self.log = log
        with log.open("wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", DRIVER, "build", str(mix), "--out", out, "--wait", *engine],
                cwd=ROOT,
                env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                stdout=f,
                stderr=subprocess.STDOUT,
            )

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 240) -> None:
        """Wait for the build to end; fail with its output unless it succeeded."""
        rc = self.proc.wait(timeout)
        assert rc == 0, f"weir build exited {rc}:\n{self.log.read_text()[-4000:]}"

    def kill(self) -> None:
        """SIGKILL the driver (nothing of it runs its cleanup) and reap it."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)


def wait_for(what: str, found: Callable[[], bool], driver: Driver, every: float = 0.1, timeout: float = 120) -> None:
    """Poll ``found()`` every ``every`` seconds until true, while ``driver`` runs; fail naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while not found():
        assert driver.running(), f"the build ended before {what}:\n{driver.log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        time.sleep(every)


def kill_worker(cluster: LocalRayCluster, task: str, driver: Driver, timeout: float = 120) -> int:
    """SIGKILL a worker inside ``task`` while ``driver``'s build runs; its pid, once the driver has heard from Ray
    that this worker died while executing a task (a kill that found the task just ended is tried again). Fails
    when the build ends, or ``timeout`` passes, before such a kill."""
    killed: list[int] = []

    def inside() -> bool:
        try:
            pid = cluster.kill_worker_running(task, timeout=0.5)
        except TimeoutError:
            return False
        heard = re.compile(rf"died or was killed while executing a task.*Worker PID: {pid}\b")
        deadline = time.monotonic() + 10
        while True:
            ended = not driver.running()
            if heard.search(driver.log.read_text()):
                killed.append(pid)
                return True
            if ended or time.monotonic() > deadline:
                return False
            time.sleep(0.1)

    wait_for(f"a worker killed inside {task}", inside, driver, every=0, timeout=timeout)
    return killed[0]


def settle(cluster: LocalRayCluster, timeout: float = 30) -> None:
    """Wait until no worker of ``cluster`` runs a build's task (Ray ends a dead driver's tasks); fail otherwise."""
    deadline = time.monotonic() + timeout
    while running := cluster.running(*TASKS):
        assert time.monotonic() < deadline, f"workers still run a dead driver's tasks after {timeout} s: {running}"
        time.sleep(0.1)


def commit_state(store: Store) -> dict[str, list[str]]:
    """What a reader of ``store`` would trust, checked: each commit record's name → what is wrong with the files it
    lists (``[]`` when all are as published; ``["damaged record"]`` when it does not read back), and, when there is
    a manifest, ``shards/manifest.json`` → what is wrong with the shard files it lists."""
    state: dict[str, list[str]] = {}
    for c in committed(store):
        if isinstance(c, Commit):
            state[c.name] = verify(store, c)
        else:  # a record that does not read back: committed() gives its name
            state[c] = ["damaged record"]
    if store.exists(f"shards/{MANIFEST}"):
        problems = ShardSet(f"{store.url}/shards", store.storage_options).file_problems()
        state[f"shards/{MANIFEST}"] = [f"{name}: {why}" for name, why in problems.items()]
    return state


def assert_same_build(store: Store, reference: Path) -> None:
    """The build in ``store`` is the reference build, byte for byte: the same files (less the reference's local
    working files), the same manifest and shard files, and the same commit records, all verified."""
    ref = Store(reference)
    files = set(store.walk("")) - LOCAL_ONLY
    expected = set(ref.walk("")) - LOCAL_ONLY
    assert files == expected, f"files not in the reference: {files - expected}; missing: {expected - files}"
    manifest = ref.read(f"shards/{MANIFEST}")
    assert store.read(f"shards/{MANIFEST}") == manifest, "the manifests differ"
    for shard in ShardSet(reference / "shards").manifest.shards:
        for f in shard.files.both():
            assert store.read(f"shards/{f.name}") == ref.read(f"shards/{f.name}"), f"shard file {f.name} differs"
    state = commit_state(store)
    assert state == {name: [] for name in commit_state(ref)}, "the commit records are not the reference's, whole"
    ours = {c.name: c.files for c in committed(store) if isinstance(c, Commit)}
    assert ours == {c.name: c.files for c in committed(ref) if isinstance(c, Commit)}, "the commit records differ"
