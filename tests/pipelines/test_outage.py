"""``pipelines/outage.py``: which errors are an unreachable endpoint, the outage limit (``WEIR_OUTAGE_S``, the
loader's default), and s3fs's retries widened to ride out a real outage (a ``moto_server`` behind a proxy that
refuses connections) for up to the limit, said once, then raised; s3fs's settings restored afterwards."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import s3fs
import s3fs.core
from aiohttp import ServerDisconnectedError
from botocore.exceptions import ClientError, EndpointConnectionError, ReadTimeoutError

from contract.errors import WeirError
from loaders import Reading
from loaders.remote import OUTAGE_S
from pipelines.outage import (
    DEFAULT_OUTAGE_S,
    OUTAGE_ENV,
    EndpointUnreachable,
    outage_limit,
    riding_outages,
    tries_for,
    unreachable,
)
from tests.conftest import S3, S3_BUCKET
from tests.faults.proxy import FaultProxy


@pytest.fixture
def fs(s3: S3) -> Iterator[tuple[Any, FaultProxy]]:
    """An s3fs filesystem of its own that reaches the endpoint through a proxy, without botocore's own few retries
    (which ride out a blip of seconds before s3fs sees it): s3fs's are what is tested."""
    with FaultProxy(s3.endpoint) as proxy:
        options = {
            **s3.options,
            "client_kwargs": {**s3.options["client_kwargs"], "endpoint_url": proxy.url},
            "config_kwargs": {"retries": {"total_max_attempts": 1}},
        }
        yield s3fs.S3FileSystem(**options, skip_instance_cache=True), proxy


def _client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_the_default_limit_is_the_loaders() -> None:
    assert DEFAULT_OUTAGE_S == OUTAGE_S == Reading().outage_s == 60


def test_the_limit_comes_from_weir_outage_s() -> None:
    assert outage_limit({}) == DEFAULT_OUTAGE_S and outage_limit({OUTAGE_ENV: " "}) == DEFAULT_OUTAGE_S
    assert outage_limit({OUTAGE_ENV: "2.5"}) == 2.5 and outage_limit({OUTAGE_ENV: "0"}) == 0
    for bad in ("-1", "soon", "1e9"):
        with pytest.raises(WeirError, match=OUTAGE_ENV):
            outage_limit({OUTAGE_ENV: bad})


def test_connection_errors_are_unreachable_and_answers_are_not() -> None:
    def wrapped(e: BaseException) -> OSError:  # as s3fs raises a server's answer: an OSError from the ClientError
        try:
            raise OSError("translated") from e
        except OSError as out:
            return out

    class StepError(Exception):  # as Dagster wraps a stage's error
        user_exception = EndpointConnectionError(endpoint_url="http://x")

    gone = [
        EndpointConnectionError(endpoint_url="http://x"),
        ReadTimeoutError(endpoint_url="http://x"),
        ServerDisconnectedError(),
        TimeoutError(),
        ConnectionRefusedError(),
        wrapped(_client_error("ServiceUnavailable", 503)),
        StepError(),
    ]
    answers = [
        FileNotFoundError("no key"),
        PermissionError("denied"),
        wrapped(_client_error("PreconditionFailed", 412)),
        _client_error("AccessDenied", 403),
        ValueError("a bug"),
    ]
    assert [unreachable(e) for e in gone] == [True] * len(gone)
    assert [unreachable(e) for e in answers] == [False] * len(answers)


@pytest.mark.parametrize("limit", [0.0, 2.0, 60.0, 600.0])
def test_the_tries_wait_past_the_limit(limit: float) -> None:
    n = tries_for(limit)
    assert sum(min(1.7**i * 0.1, 15.0) for i in range(n - 1)) >= limit
    assert n >= s3fs.core.S3FileSystem.retries or limit == 0


def test_a_refused_endpoint_is_retried_until_it_answers_and_said_once(fs: tuple[Any, FaultProxy]) -> None:
    s3, proxy = fs
    said: list[str] = []

    def say(line: str) -> None:  # the endpoint comes back 2 s after the first refusal is said, not by the clock
        # alone: a cut timed from before the request could end before a loaded machine sends it
        said.append(line)
        threading.Timer(2.0, proxy.resume).start()

    retries, handler = s3fs.core.S3FileSystem.retries, s3fs.core.CUSTOM_ERROR_HANDLER
    s3.ls(S3_BUCKET)  # the client made (slow on a loaded machine) before the endpoint goes
    with riding_outages("s3://weir-store/x", say, limit_s=30) as outages:
        assert s3fs.core.S3FileSystem.retries == tries_for(30)
        proxy.cut("refuse")
        s3.pipe(f"{S3_BUCKET}/outage/a", b"after the outage")
        s3.pipe(f"{S3_BUCKET}/outage/b", b"and the next")
    assert s3.cat(f"{S3_BUCKET}/outage/a") == b"after the outage"
    assert said == [
        "warning: s3://weir-store/x: endpoint unreachable (EndpointConnectionError), retrying for up to 30 s"
    ]
    assert outages.exceeded is None and outages.waited == 1
    assert (s3fs.core.S3FileSystem.retries, s3fs.core.CUSTOM_ERROR_HANDLER) == (retries, handler), "restored"


def test_an_outage_past_the_limit_is_raised_and_made_one_line(fs: tuple[Any, FaultProxy], s3: S3) -> None:
    store_fs, proxy = fs
    proxy.cut("refuse")
    with riding_outages("s3://weir-store/x", lambda _s: None, limit_s=1) as outages, pytest.raises(Exception) as e:
        store_fs.pipe(f"{S3_BUCKET}/outage/c", b"never")
    assert unreachable(e.value) and outages.exceeded is not None
    line = str(outages.failure(e.value, "its lease was released"))
    assert isinstance(outages.failure(e.value), EndpointUnreachable) and "\n" not in line
    assert line.startswith("build root s3://weir-store/x: the endpoint did not answer within 1 s (")
    assert "its lease was released" in line and OUTAGE_ENV in line and s3.options["secret"] not in line
    proxy.resume()
    assert not store_fs.exists(f"{S3_BUCKET}/outage/c")


def test_no_retry_once_the_lease_is_not_sure_to_be_the_builds(fs: tuple[Any, FaultProxy]) -> None:
    store_fs, proxy = fs
    proxy.cut("refuse")
    start = time.monotonic()
    with (
        riding_outages("s3://weir-store/x", lambda _s: None, limit_s=60, until=lambda: start) as outages,
        pytest.raises(EndpointConnectionError),
    ):
        store_fs.pipe(f"{S3_BUCKET}/outage/d", b"never")
    assert outages.exceeded is not None and outages.waited == 0
