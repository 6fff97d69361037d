"""``pipelines/lease.py``: renewals, on a real ``moto_server`` (through a fault-injecting proxy where the network
fails): a renewal refused for a reason other than a take-over loses the lease saying why; one that meets an
unreachable endpoint is retried, keeping the lease through an outage shorter than its ttl, or longer but within
``WEIR_OUTAGE_S`` when nobody took it meanwhile, and losing it past both."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import boto3
import pytest

from contract.store import Store
from mixing.output.commit import commit
from pipelines.lease import LEASE_NAME, LeaseLost, root_lease
from tests.conftest import S3, S3_BUCKET
from tests.faults.proxy import CutMode, FaultProxy
from tests.pipelines.lease_helpers import TTL
from tests.pipelines.lease_helpers import wait_until as _wait_until


@pytest.fixture
def proxy(s3: S3) -> Iterator[FaultProxy]:
    with FaultProxy(s3.endpoint) as p:
        yield p


def _via(s3: S3, proxy: FaultProxy) -> dict[str, Any]:
    """Storage options that reach the endpoint through ``proxy``."""
    return {**s3.options, "client_kwargs": {**s3.options["client_kwargs"], "endpoint_url": proxy.url}}


def _lease(s3: S3, store: Store) -> dict[str, Any]:
    """The lease object's body, read past any proxy."""
    key = f"{store.root.partition('/')[2]}/{LEASE_NAME}"
    return dict(json.loads(s3.client.get_object(Bucket=S3_BUCKET, Key=key)["Body"].read()))


def test_a_renewal_refused_for_another_reason_loses_the_lease_saying_why(store: Store, s3: S3) -> None:
    iam = boto3.client(
        "iam",
        endpoint_url=s3.endpoint,
        region_name=s3.options["client_kwargs"]["region_name"],
        aws_access_key_id=s3.options["key"],
        aws_secret_access_key=s3.options["secret"],
    )
    key = iam.create_access_key(UserName="weir")["AccessKey"]
    revocable = Store.open(store.url, s3.with_credentials(key["AccessKeyId"], key["SecretAccessKey"]))
    with pytest.raises(LeaseLost) as e, root_lease(revocable, wait=False, say=print, ttl=TTL) as lease:
        assert lease is not None
        iam.delete_access_key(UserName="weir", AccessKeyId=key["AccessKeyId"])
        _wait_until("the renewal is refused", lambda: lease.lost is not None, timeout_s=3 * TTL)
        assert str(lease.lost).startswith("its renewal failed: PermissionError"), lease.lost
    assert "who holds it now is not known" in str(e.value) and key["SecretAccessKey"] not in str(e.value)


@pytest.mark.parametrize("mode", ["refuse", "stall"])
def test_a_renewal_survives_a_connection_error_shorter_than_its_ttl(
    store: Store, s3: S3, proxy: FaultProxy, mode: CutMode
) -> None:
    via = Store.open(store.url, _via(s3, proxy))
    said: list[str] = []
    with root_lease(via, wait=False, say=said.append, ttl=8.0) as lease:  # a beat every 2 s, 2 s per request
        assert lease is not None
        proxy.cut(mode, seconds=4.0)
        time.sleep(4.0)
        beat = _lease(s3, store)["beat"]
        _wait_until("a renewal after the cut", lambda: _lease(s3, store)["beat"] > beat, timeout_s=6.0)
        assert lease.lost is None
        commit(via, "plan", None, [])  # still admitted
    assert any("endpoint unreachable, renewing the lease again" in s for s in said), said
    assert not store.exists(LEASE_NAME) and proxy.connections > 0


def test_an_endpoint_back_after_the_ttl_but_within_the_outage_limit_keeps_the_lease_nobody_took(
    store: Store, s3: S3, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the renewal that lands is conditional on this build's ETag, which a take-over would have changed
    monkeypatch.setenv("WEIR_OUTAGE_S", "30")
    via = Store.open(store.url, _via(s3, proxy))
    with root_lease(via, wait=False, say=print, ttl=TTL) as lease:
        assert lease is not None
        beat = _lease(s3, store)["beat"]
        proxy.cut("refuse")
        time.sleep(TTL + 1.0)
        assert lease.lost is None
        proxy.resume()
        _wait_until("a renewal after the outage", lambda: _lease(s3, store)["beat"] > beat, timeout_s=3 * TTL)
        commit(via, "plan", None, [])  # admitted again
        assert lease.lost is None
    assert store.exists("commits/plan.json") and not store.exists(LEASE_NAME)


def test_an_endpoint_unreachable_past_the_ttl_and_the_outage_limit_loses_the_lease_and_says_why(
    store: Store, s3: S3, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WEIR_OUTAGE_S", "1")
    via = Store.open(store.url, _via(s3, proxy))
    with pytest.raises(LeaseLost) as e, root_lease(via, wait=False, say=print, ttl=TTL) as lease:
        assert lease is not None
        proxy.cut("refuse")
        _wait_until("the lease lapses", lambda: lease.lost is not None, timeout_s=3 * TTL)
        proxy.resume()
        with pytest.raises(LeaseLost):
            commit(via, "plan", None, [])
    assert "did not answer for its ttl of 2 s and 1 s of outage" in str(e.value)
    assert not store.exists("commits/plan.json")
    assert store.exists(LEASE_NAME), "a lapsed lease is not removed: another build may hold it, or take it over"
