"""The Dagster side of builds on a cluster: the ``engine`` resource from the environment, the ``storage``
resource on an object store (refused when unreachable), and a mix materialized through Dagster on a real
two-node Ray cluster into a real S3 endpoint, equal to the local build."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from assets import WeirEngine, WeirStorage
from mixing import load_mix
from mixing.errors import WeirError
from mixing.format.store import StoreError
from pipelines.build import build_mix
from pipelines.definitions import load_definitions
from pipelines.resources import engine_resource
from tests.conftest import moto_endpoint
from tests.ray_cluster import LocalRayCluster

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "weir-dagster"
S3_ENV = {"AWS_ACCESS_KEY_ID": "weir", "AWS_SECRET_ACCESS_KEY": "not-a-secret", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    boto3 = pytest.importorskip("boto3")
    with moto_endpoint() as url:
        boto3.client("s3", endpoint_url=url, **_boto(S3_ENV)).create_bucket(Bucket=BUCKET)
        yield url


def _boto(env: dict[str, str]) -> dict[str, str]:
    return {
        "aws_access_key_id": env["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": env["AWS_SECRET_ACCESS_KEY"],
        "region_name": env["AWS_DEFAULT_REGION"],
    }


def test_the_engine_resource_comes_from_the_environment_and_shows_in_the_definitions(
    tmp_path: Path, tiny_mix_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert engine_resource({}).kind == "local"
    ray = engine_resource({"WEIR_ENGINE": "ray", "WEIR_RAY_ADDRESS": "head:6379"})
    assert ray.kind == "ray" and isinstance(ray.ray_address, dg.EnvVar)  # the UI shows the variable
    with pytest.raises(WeirError, match=r"engine 'spark'.*expected local or ray"):
        engine_resource({"WEIR_ENGINE": "spark"})

    monkeypatch.setenv("WEIR_ENGINE", "ray")
    monkeypatch.setenv("WEIR_RAY_ADDRESS", "head:6379")
    mixes = tmp_path / "mixes"
    mixes.mkdir()
    (mixes / "tiny.yaml").write_text(tiny_mix_path.read_text())
    defs = load_definitions(mixes, tmp_path / "build")
    engine = defs.resources["engine"]
    assert isinstance(engine, WeirEngine) and engine.kind == "ray"
    documents = defs.resolve_assets_def(dg.AssetKey(["tiny", "documents"]))
    assert {"storage", "engine"} <= documents.required_resource_keys


def test_a_storage_root_fsspec_cannot_reach_is_refused_never_a_local_folder(
    tmp_path: Path, tiny_mix_path: Path, endpoint: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    mix = load_mix(tiny_mix_path)
    with pytest.raises(StoreError, match="nosuch://"):
        WeirStorage(root="nosuch://bucket/builds").layout(mix)
    missing = WeirStorage(root="s3://no-such-bucket/builds", s3_endpoint_url=endpoint, **_creds())
    with pytest.raises(StoreError, match="no bucket 'no-such-bucket'") as e:
        missing.layout(mix)
    assert "not-a-secret" not in str(e.value) and "\n" not in str(e.value)
    assert not list(tmp_path.glob("s3*")) and not list(tmp_path.glob("nosuch*")), "no local folder was made"


def _creds() -> dict[str, str]:
    return {"aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"]}


def test_dagster_materializes_a_mix_on_ray_into_s3_equal_to_the_local_build(
    tmp_path: Path,
    tiny_mix_path: Path,
    endpoint: str,
    ray_cluster: LocalRayCluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray = pytest.importorskip("ray")
    mix = load_mix(tiny_mix_path)
    build_mix(mix, tmp_path / "local", say=lambda _s: None)

    for k, v in {**S3_ENV, "AWS_ENDPOINT_URL": endpoint, "WEIR_WORK_DIR": str(tmp_path / "work")}.items():
        monkeypatch.setenv(k, v)
    instance = dg.DagsterInstance.ephemeral()
    url = f"s3://{BUCKET}/tiny"
    try:
        build_mix(
            mix,
            url,
            say=lambda _s: None,
            instance=instance,
            engine=WeirEngine(kind="ray", ray_address=ray_cluster.address),
        )
    finally:
        ray.shutdown()  # this process was a driver of the session's cluster: let the next test connect afresh

    s3fs = pytest.importorskip("s3fs")
    fs = s3fs.S3FileSystem(
        endpoint_url=endpoint, key=S3_ENV["AWS_ACCESS_KEY_ID"], secret=S3_ENV["AWS_SECRET_ACCESS_KEY"]
    )
    local = json.loads((tmp_path / "local" / "shards" / "manifest.json").read_text())
    assert json.loads(fs.cat_file(f"{BUCKET}/tiny/shards/manifest.json")) == local, "every shard's sha256 is equal"
    records = instance.fetch_materializations(dg.AssetKey(["tiny", "documents"]), limit=100).records
    metadata = {r.asset_materialization.partition: r.asset_materialization.metadata for r in records}  # type: ignore[union-attr]
    assert set(metadata) == set(mix.sources)
    for source, md in metadata.items():
        assert md["engine"].value == "ray" and md["workers"].value == 2, source  # type: ignore[attr-defined]
    assert not (tmp_path / "s3:").exists()

    weir = [sys.executable, "-m", "pipelines.cli", "inspect", "--json"]
    remote = subprocess.run([*weir, url], capture_output=True, text=True, cwd=ROOT)  # every shard hashed in S3
    assert remote.returncode == 0, remote.stderr
    here = subprocess.run([*weir, str(tmp_path / "local")], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(remote.stdout) == json.loads(here.stdout)
