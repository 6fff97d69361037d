"""The Dagster side of builds on a cluster: the ``engine`` resource from the environment, shown in the
definitions, and the ``storage`` resource on an object store, refused when unreachable. (Builds through these
resources on a real Ray cluster into S3: ``tests/pipelines/test_ray_build.py``.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

import dagster as dg
import pytest

from assets import WeirEngine, WeirStorage
from contract.errors import WeirError
from contract.store import StoreError
from mixing import load_mix
from pipelines.definitions import load_definitions
from pipelines.resources import engine_resource
from tests.conftest import moto_endpoint

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
    assert defs.resources is not None
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


class _Creds(TypedDict):
    """WeirStorage's credential fields, by name."""

    aws_access_key_id: str
    aws_secret_access_key: str


def _creds() -> _Creds:
    return {"aws_access_key_id": S3_ENV["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": S3_ENV["AWS_SECRET_ACCESS_KEY"]}
