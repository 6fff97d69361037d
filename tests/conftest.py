"""Shared fixtures: a tiny mix written into a temporary folder, the demo mix built once per session, a real S3
endpoint, and a real two-node Ray cluster shared by the session."""

from __future__ import annotations

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

from tests.ray_cluster import RAY_ENV, LocalRayCluster

ROOT = Path(__file__).resolve().parent.parent
# ../shared beside the checkout (a git worktree one level deeper also finds it); absent on users' machines.
SHARED = next((p for p in (ROOT.parent / "shared", ROOT.parent.parent / "shared") if p.is_dir()), None)


def shared_path(*parts: str) -> Path:
    """A path under ../shared, or skip the calling test with a clear reason when it is absent."""
    if SHARED is None or not SHARED.joinpath(*parts).exists():
        pytest.skip(f"../shared/{'/'.join(parts)} is not here (real test data lives beside the checkout)")
    assert SHARED is not None
    return SHARED.joinpath(*parts)


def pytest_configure(config: pytest.Config) -> None:
    """A temporary DAGSTER_HOME for the whole session, set before any test module is imported (some build
    their subprocesses' environment at import): `weir build` records its runs into $DAGSTER_HOME, else into
    the repository's .dagster_home, which tests must never write into."""
    config.stash[_OLD_HOME] = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = tempfile.mkdtemp(prefix="weir-test-dagster-home-")
    # Ray reads these when imported, here and in every driver subprocess (tests/ray_cluster.py)
    config.stash[_OLD_RAY_ENV] = {name: os.environ.get(name) for name in RAY_ENV}
    os.environ.update(RAY_ENV)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(os.environ.pop("DAGSTER_HOME", ""), ignore_errors=True)
    old = config.stash.get(_OLD_HOME, None)
    if old is not None:
        os.environ["DAGSTER_HOME"] = old
    for name, value in config.stash.get(_OLD_RAY_ENV, {}).items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


_OLD_HOME = pytest.StashKey[str | None]()
_OLD_RAY_ENV = pytest.StashKey[dict[str, str | None]]()


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


MOTO_SERVER = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")


@contextmanager
def moto_endpoint() -> Iterator[str]:
    """A real local S3 endpoint: ``moto_server`` on a free 127.0.0.1 port, stopped by its own pid on exit.

    Skips the calling test with a clear reason when ``moto_server`` is not installed. Yields the endpoint URL.
    """
    if MOTO_SERVER is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]', in the dev extras)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    proc = subprocess.Popen(
        [MOTO_SERVER, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.fail("moto_server did not start within 30 s")
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
