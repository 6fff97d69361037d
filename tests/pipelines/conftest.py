"""Fixtures of the pipelines tests that talk to object storage: one ``moto_server`` per test module that asks
for it (:func:`tests.conftest.s3_endpoint`), and a fresh prefix of its bucket per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from contract.store import Store
from tests.conftest import S3, S3_BUCKET, s3_endpoint

__all__: list[str] = []


@pytest.fixture(scope="module")
def s3() -> Iterator[S3]:
    with s3_endpoint() as endpoint:
        yield endpoint


@pytest.fixture
def store(s3: S3, request: pytest.FixtureRequest) -> Store:
    """An empty build root on the module's endpoint, named after the test (each test its own prefix)."""
    return Store.open(f"s3://{S3_BUCKET}/{request.node.name[:40]}", s3.options)
