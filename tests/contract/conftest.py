"""Build roots for the storage tests: a local folder, and a prefix on a real S3 endpoint that checks credentials
(one ``moto_server`` per test module, started only by modules that ask for it: :func:`tests.conftest.s3_endpoint`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.store import Store
from tests.conftest import S3, S3_BUCKET, s3_endpoint

BUCKET = S3_BUCKET
__all__ = ["BUCKET", "S3"]


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_endpoint() as endpoint:
        yield endpoint


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    """An empty build root opened with :meth:`Store.open`: a local folder, or a fresh prefix in the s3 bucket."""
    if request.param == "local":
        return Store.open(tmp_path / "root")
    s3: S3 = request.getfixturevalue("s3")
    return Store.open(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3.options)
