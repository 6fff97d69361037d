"""Shared fixtures: a tiny mix written into a temporary folder, the demo mix built once per session, a real S3
endpoint, and a real two-node Ray cluster shared by the session."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests.ray_cluster import RAY_ENV, LocalRayCluster

ROOT = Path(__file__).resolve().parent.parent
# ../shared beside the checkout (a git worktree one level deeper also finds it); absent on users' machines.
SHARED = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()), None)


# No per-example deadline and no "too slow" health check: a property's examples are checked for what they
# compute, and a loaded machine (two workers beside a Ray cluster) makes their time noise, not a failure. Timing
# lives in benchmarks/. (A test's own suppress_health_check list replaces this one: list too_slow there too.)
settings.register_profile("weir", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("weir")


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the calling test with a clear reason when it is absent."""
    if SHARED is None or not SHARED.joinpath(*parts).exists():
        pytest.skip(f"../shared/{'/'.join(parts)} is not here (real test data lives beside the checkout)")
    assert SHARED is not None
    return SHARED.joinpath(*parts)


# Free space a RAM-backed /dev/shm must have to hold the session's DAGSTER_HOME (tens of MB in a whole run).
_SHM_FREE_BYTES = 2 * 2**30


def _ram_tmp() -> str | None:
    """/dev/shm when it is a writable folder with room to spare, else None (the system's temporary folder).

    Dagster's SQLite storage commits (and syncs to disk) once per event: on a disk busy with other work, a
    tiny `weir build` waited for those syncs about as long as it computed (21 s instead of 11 s). In RAM they
    cost nothing; what is stored, and read back, is the same."""
    shm = "/dev/shm"
    try:
        st = os.statvfs(shm)
    except OSError:
        return None
    if not os.access(shm, os.W_OK | os.X_OK) or st.f_bavail * st.f_frsize < _SHM_FREE_BYTES:
        return None
    return shm


def pytest_configure(config: pytest.Config) -> None:
    """A temporary DAGSTER_HOME for the whole session, set before any test module is imported (some build
    their subprocesses' environment at import): `weir build` records its runs into $DAGSTER_HOME, else into
    the repository's .dagster_home, which tests must never write into. (Each pytest-xdist worker has its own.)"""
    config.stash[_OLD_HOME] = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = tempfile.mkdtemp(prefix="weir-test-dagster-home-", dir=_ram_tmp())
    # Nor into the user's caches (~/.cache/weir): the loader's node index and verdicts, the builds' working
    # folders. One of each per session, so that a run starts as cold as CI's fresh machine does.
    config.stash[_OLD_CACHES] = {name: os.environ.get(name) for name in _CACHES}
    for name in _CACHES:
        os.environ[name] = tempfile.mkdtemp(prefix=f"weir-test-{name.lower()}-")
    # Ray reads these when imported, here and in every driver subprocess (tests/ray_cluster.py)
    config.stash[_OLD_RAY_ENV] = {name: os.environ.get(name) for name in RAY_ENV}
    os.environ.update(RAY_ENV)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ.pop("DAGSTER_HOME", ""), ignore_errors=True)
    old = config.stash.get(_OLD_HOME, None)
    if old is not None:
        os.environ["DAGSTER_HOME"] = old
    for name in _CACHES:
        shutil.rmtree(os.environ.get(name, ""), ignore_errors=True)
    empty: dict[str, str | None] = {}
    old_env = [*config.stash.get(_OLD_RAY_ENV, empty).items(), *config.stash.get(_OLD_CACHES, empty).items()]
    for name, value in old_env:
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


_OLD_HOME = pytest.StashKey[str | None]()
_CACHES = ("WEIR_CACHE_DIR", "WEIR_WORK_DIR")
_OLD_CACHES = pytest.StashKey[dict[str, str | None]]()
_OLD_RAY_ENV = pytest.StashKey[dict[str, str | None]]()


# Under pytest-xdist (`make test` runs `-n 2 --dist loadfile`): every test module runs whole on one worker, in its
# own order, as it does alone (its module fixtures set up once), and the modules that use the session's Ray cluster
# (:func:`ray_cluster`) run together on one worker, in collection order: one cluster for them all, as without
# xdist, and one DAGSTER_HOME for the Ray drivers' runs that their tests read back. Each worker has its own
# DAGSTER_HOME (:func:`pytest_configure`), temporary folders and session fixtures. (Not `--dist loadgroup`: under
# pytest 9 the groups its xdist_group marks name never reach the scheduler.)
RAY_SCOPE = "Ray cluster"


def _uses_ray_cluster(module: Path) -> bool:
    """Whether a test module asks for :func:`ray_cluster` (in a test's or one of its own fixtures' arguments)."""
    try:
        return "ray_cluster" in module.read_text()
    except OSError:
        return False


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which a run without it does not know
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` with the Ray modules as one unit, and the units handed out in the workers' collection
    order (see :func:`pytest_collection_modifyitems`) rather than by their number of tests."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    ray_modules: dict[str, bool] = {}

    class ModulesAndRay(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            if module not in ray_modules:
                ray_modules[module] = _uses_ray_cluster(config.rootpath / module)
            return RAY_SCOPE if ray_modules[module] else module

        def schedule(self) -> None:
            reorder, config.option.loadscopereorder = config.option.loadscopereorder, False
            try:
                super().schedule()
            finally:
                config.option.loadscopereorder = reorder

    return ModulesAndRay(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, whole modules reordered so that the longest work is handed out first and short
    modules fill the end: the Ray modules, then the modules with a test marked ``slow`` (each in collection order),
    then the rest, most tests first; a module's tests keep their order. Without xdist, nothing changes."""
    if not hasattr(config, "workerinput"):
        return
    kinds: dict[str, int] = {}
    counts: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        kind = 0 if "ray_cluster" in getattr(item, "fixturenames", ()) else 1 if item.get_closest_marker("slow") else 2
        kinds[module] = min(kinds.get(module, 2), kind)
        counts[module] = counts.get(module, 0) + 1

    def rank(item: pytest.Item) -> tuple[int, int]:
        module = item.nodeid.split("::", 1)[0]
        return kinds[module], -counts[module] if kinds[module] == 2 else 0

    items.sort(key=rank)  # stable: equal ranks keep collection order


@pytest.fixture(scope="session")
def dagster_home() -> Path:
    """The session's DAGSTER_HOME (see :func:`pytest_configure`)."""
    return Path(os.environ["DAGSTER_HOME"])


def write_tiny_sources(root: Path) -> None:
    """Two small sources: 12 text files (one longer than S=64 tokens) and a jsonl with one bad line."""
    (root / "notes").mkdir(parents=True, exist_ok=True)
    for i in range(12):
        words = " ".join(f"word{(i * 7 + k) % 23}" for k in range(5 + 9 * i))
        (root / "notes" / f"n{i:02d}.txt").write_text(f"Note {i}. {words}.\n")
    lines = [json.dumps({"q": f"what is {i}+{i}?", "a": str(2 * i)}) for i in range(40)]
    lines.insert(5, "{not json")
    (root / "qa.jsonl").write_text("\n".join(lines) + "\n")


TINY_MIX = """\
name: tiny
seed: 7
tokenizer: {{kind: bytes}}
sequence: {{length: 64, global_batch: 4}}
sources:
  notes: {{uri: "{root}/notes/*.txt", format: text, max_epochs: 50}}
  qa:    {{uri: "{root}/qa.jsonl", format: jsonl, template: "Q: {{q}} A: {{a}}", max_epochs: 50}}
curriculum:
  - {{phase: first, steps: 3, mixture: {{notes: 0.75, qa: 0.25}}}}
  - {{phase: second, steps: 5, mixture: {{notes: 0.25, qa: 0.75}}}}
"""


@pytest.fixture
def tiny_mix_path(tmp_path: Path) -> Path:
    write_tiny_sources(tmp_path / "data")
    p = tmp_path / "tiny.yaml"
    p.write_text(TINY_MIX.format(root=tmp_path / "data"))
    return p


@pytest.fixture(scope="session")
def demo_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded demo mix, built once by the real CLI (demo data generated into a temp folder)."""
    base = tmp_path_factory.mktemp("demo")
    data = base / "demo-data"
    weir = [sys.executable, "-m", "pipelines.cli"]
    subprocess.run([*weir, "demo-data", "--out", str(data)], check=True, cwd=ROOT)
    mix = (ROOT / "mixes" / "demo.yaml").read_text().replace("{mix_dir}/../build/demo-data", str(data))
    (base / "demo.yaml").write_text(mix)
    out = base / "build"
    subprocess.run([*weir, "build", str(base / "demo.yaml"), "--out", str(out)], check=True, cwd=ROOT)
    return out


@pytest.fixture(scope="session")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny build (bytes tokenizer, S=64, 4 sequences per step, 8 steps in two phases), built once per session
    by the real CLI, for every folder's tests."""
    base = tmp_path_factory.mktemp("tiny")
    write_tiny_sources(base / "data")
    (base / "tiny.yaml").write_text(TINY_MIX.format(root=base / "data"))
    out = base / "build"
    subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "build", str(base / "tiny.yaml"), "--out", str(out)],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    return out


HAS_MOTO_SERVER = all(importlib.util.find_spec(m) is not None for m in ("moto", "flask"))  # moto[server]
S3_SERVER = Path(__file__).with_name("s3_server.py")  # moto's server, its conditional writes atomic as on S3


@contextmanager
def moto_endpoint() -> Iterator[str]:
    """A real local S3 endpoint: moto's server (:mod:`tests.s3_server`: its conditional writes atomic, as S3's
    are) on a free 127.0.0.1 port, stopped by its own pid on exit.

    Skips the calling test with a clear reason when moto's server is not installed; a server that does not start
    fails it with the server's last line. Yields the endpoint URL.
    """
    if not HAS_MOTO_SERVER:
        pytest.skip("moto_server is not installed (pip install 'moto[server]', in the dev extras)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(
            [sys.executable, str(S3_SERVER), "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=log
        )
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        log.seek(0)
                        said = (log.read().decode(errors="replace").strip().splitlines() or ["(it said nothing)"])[-1]
                        pytest.fail(f"{S3_SERVER.name} did not start within 30 s: {said}")
                    time.sleep(0.1)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(10)


S3_BUCKET = "weir-store"
S3_REGION = "us-east-1"


@dataclass(frozen=True)
class S3:
    """A running endpoint: its URL, storage options with valid credentials, and a boto3 client signed with them."""

    endpoint: str
    options: dict[str, Any]
    client: Any

    def with_credentials(self, key: str, secret: str) -> dict[str, Any]:
        return {**self.options, "key": key, "secret": secret}

    def env(self) -> dict[str, str]:
        """The ``AWS_*`` variables ``weir build --out s3://...`` reads: this endpoint and its valid credentials."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.options["key"],
            "AWS_SECRET_ACCESS_KEY": self.options["secret"],
            "AWS_DEFAULT_REGION": S3_REGION,
        }


@contextmanager
def s3_endpoint() -> Iterator[S3]:
    """A real S3 endpoint that checks credentials (:func:`moto_endpoint` with IAM authentication on), holding the
    bucket :data:`S3_BUCKET`: refused credentials are refused as on AWS. Its first three requests (unauthenticated)
    create a user, its policy and its access key; every request after them must be signed with that key. Skips
    the calling test when s3fs, boto3 or moto_server is missing."""
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    with ExitStack() as stack:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "3")  # read by the server process as it starts
            endpoint = stack.enter_context(moto_endpoint())
        anyone = {"endpoint_url": endpoint, "region_name": S3_REGION}
        iam = boto3.client("iam", aws_access_key_id="x", aws_secret_access_key="x", **anyone)
        iam.create_user(UserName="weir")
        allow = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="weir", PolicyName="all", PolicyDocument=json.dumps(allow))
        key = iam.create_access_key(UserName="weir")["AccessKey"]
        client = boto3.client(
            "s3", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"], **anyone
        )
        client.create_bucket(Bucket=S3_BUCKET)
        options = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"], "client_kwargs": anyone}
        yield S3(endpoint, options, client)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[LocalRayCluster]:
    """A real two-node Ray cluster on 127.0.0.1 (``tests/ray_cluster.py``), one for the whole session: started
    by the first test that asks for it, stopped at the session's end. Skips when ray is not installed."""
    pytest.importorskip("ray", reason="ray is not installed (the Ray engine's tests need a real Ray cluster)")
    with LocalRayCluster() as cluster:
        yield cluster
