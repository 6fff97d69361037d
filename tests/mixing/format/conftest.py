"""Build roots for the storage tests: a local folder, and a prefix on a real S3 endpoint that checks credentials.

The endpoint is one ``moto_server`` per test module (started only by modules that ask for it) with IAM
authentication on, so that refused credentials are refused as on AWS: its first three requests (unauthenticated)
create a user, its policy and its access key; every request after them must be signed with that key.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mixing.format.store import Store
from tests.conftest import moto_endpoint

BUCKET = "weir-store"
REGION = "us-east-1"


@dataclass(frozen=True)
class S3:
    """A running endpoint: its URL, storage options with valid credentials, and a boto3 client signed with them."""

    endpoint: str
    options: dict[str, Any]
    client: Any

    def with_credentials(self, key: str, secret: str) -> dict[str, Any]:
        return {**self.options, "key": key, "secret": secret}


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    pytest.importorskip("s3fs")
    boto3 = pytest.importorskip("boto3")
    with contextlib.ExitStack() as stack:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "3")  # read by the server process as it starts
            endpoint = stack.enter_context(moto_endpoint())
        anyone = {"endpoint_url": endpoint, "region_name": REGION}
        iam = boto3.client("iam", aws_access_key_id="x", aws_secret_access_key="x", **anyone)
        iam.create_user(UserName="weir")
        allow = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="weir", PolicyName="all", PolicyDocument=json.dumps(allow))
        key = iam.create_access_key(UserName="weir")["AccessKey"]
        client = boto3.client(
            "s3", aws_access_key_id=key["AccessKeyId"], aws_secret_access_key=key["SecretAccessKey"], **anyone
        )
        client.create_bucket(Bucket=BUCKET)
        options = {"key": key["AccessKeyId"], "secret": key["SecretAccessKey"], "client_kwargs": anyone}
        yield S3(endpoint, options, client)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """An empty build root opened with :meth:`Store.open`: a local folder, or a fresh prefix in the s3 bucket."""
    if request.param == "local":
        return Store.open(tmp_path / "root")
    s3: S3 = request.getfixturevalue("s3")
    return Store.open(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3.options)
