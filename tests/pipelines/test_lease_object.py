"""``pipelines/lease_object.py``: the lease object's conditional requests on a real ``moto_server``: created only if
absent, replaced only under its ETag (refused as taken over, or as removed), removed only under its ETag, read
with its age by the server's clock; a request held by a stalled connection is cancelled within its timeouts."""

from __future__ import annotations

import asyncio
import json

import pytest

from contract.store import Store
from pipelines.lease_object import LEASE_NAME, Refused, delete, head, lease_fs, put
from pipelines.outage import unreachable
from tests.conftest import S3
from tests.faults.proxy import FaultProxy


def test_created_only_if_absent_and_replaced_only_under_its_etag(store: Store) -> None:
    fs = lease_fs(store, 8)
    first = put(store, fs, {"holder": "a"}, if_match=None)
    with pytest.raises(Refused):
        put(store, fs, {"holder": "b"}, if_match=None)
    second = put(store, fs, {"holder": "a", "beat": 1}, if_match=first)
    with pytest.raises(Refused) as e:
        put(store, fs, {"holder": "b"}, if_match=first)
    assert e.value.why == "another build took it over"
    found = head(store, fs)
    assert found is not None and found[0] == second and found[1] == {"holder": "a", "beat": 1}
    assert 0 <= found[2] < 5, "its age, by the server's clock"


def test_removed_only_under_its_etag_and_a_removed_lease_refuses_its_renewal(store: Store) -> None:
    fs = lease_fs(store, 8)
    first = put(store, fs, {"holder": "a"}, if_match=None)
    second = put(store, fs, {"holder": "b"}, if_match=first)
    delete(store, fs, first)  # taken over meanwhile: left to its holder
    assert json.loads(store.read(LEASE_NAME)) == {"holder": "b"}
    delete(store, fs, second)
    assert not store.exists(LEASE_NAME) and head(store, fs) is None
    with pytest.raises(Refused) as e:
        put(store, fs, {"holder": "b"}, if_match=second)
    assert e.value.why == "its object was removed"


def test_a_request_on_a_stalled_connection_is_cancelled_within_its_timeouts(store: Store, s3: S3) -> None:
    with FaultProxy(s3.endpoint) as proxy:
        client = {**s3.options["client_kwargs"], "endpoint_url": proxy.url}
        via = Store.open(store.url, {**s3.options, "client_kwargs": client})
        fs = lease_fs(via, 8)
        etag = put(via, fs, {"holder": "a"}, if_match=None)
        proxy.cut("stall")  # resumed only after the request gave up: it must give up while the stall lasts
        with pytest.raises(Exception) as e:
            put(via, fs, {"holder": "a", "beat": 1}, if_match=etag)
        assert proxy.is_cut == "stall"
        proxy.resume()
    assert unreachable(e.value), repr(e.value)
    assert json.loads(store.read(LEASE_NAME)) == {"holder": "a"}, "the held request never reached the endpoint"


def test_the_making_of_the_client_does_not_count_against_a_requests_bound(store: Store) -> None:
    """A first use makes the client (botocore's models: a second of CPU, more on a loaded machine) and sends
    nothing: a lease's first request must not spend its bound on it."""
    fs = lease_fs(store, 8)
    set_session = fs.set_session

    async def slow_first_set_up(*args: object, **kwargs: object) -> object:
        if fs._s3 is None:
            await asyncio.sleep(fs.lease_timeout_s * 1.25)
        return await set_session(*args, **kwargs)

    fs.set_session = slow_first_set_up
    put(store, fs, {"holder": "a"}, if_match=None)
    assert json.loads(store.read(LEASE_NAME)) == {"holder": "a"}
