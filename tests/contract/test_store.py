"""Store: checksummed whole-file writes, reads, ranges and listings on a local folder and on a real S3 endpoint
(moto_server with credentials checked), and Store.open's one-line refusals that never show a secret."""

from __future__ import annotations

import hashlib
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.redaction import redact_url
from contract.store import Store, StoreError
from tests.contract.conftest import BUCKET, S3

SECRET = "SUPERSECRET"
EXAMPLES = settings(max_examples=15, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def test_put_returns_the_size_and_sha256_that_digest_reads_back(store: Store) -> None:
    data = bytes(range(256)) * 3

    def write(f: BinaryIO) -> None:  # in pieces, one of them not bytes
        f.write(data[:100])
        f.write(memoryview(data)[100:])

    puts: list[tuple[str, Callable[[BinaryIO], None] | bytes, bytes]] = [
        ("a.bin", data, data),
        ("deep/er/b.bin", write, data),
        ("empty.bin", b"", b""),
    ]
    for name, what, expected in puts:
        got = store.put(name, what)
        assert got == {"name": name, "bytes": len(expected), "sha256": hashlib.sha256(expected).hexdigest()}
        assert store.digest(name) == (got["bytes"], got["sha256"])
        assert store.size(name) == len(expected)
        assert store.read(name) == expected
    store.put("a.bin", b"shorter")  # replaced whole
    assert store.read("a.bin") == b"shorter" and store.digest("a.bin") == (7, hashlib.sha256(b"shorter").hexdigest())
    assert store.digest("nothing.bin") is None and store.size("nothing.bin") is None


def test_put_file_and_get_file_copy_whole_files(store: Store, tmp_path: Path) -> None:
    src = tmp_path / "src.bin"
    src.write_bytes(b"\x00\xff" * 5000)
    got = store.put_file("in/src.bin", src)
    assert got == {"name": "in/src.bin", "bytes": 10000, "sha256": hashlib.sha256(src.read_bytes()).hexdigest()}
    store.get_file("in/src.bin", tmp_path / "out" / "copy.bin")
    assert (tmp_path / "out" / "copy.bin").read_bytes() == src.read_bytes()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["copy.bin"]  # no temporary file left beside it
    with pytest.raises(FileNotFoundError):
        store.get_file("in/missing.bin", tmp_path / "out" / "missing.bin")
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["copy.bin"]


@settings(EXAMPLES)
@given(data=st.binary(max_size=3000))
def test_any_bytes_put_read_back_as_put(store: Store, data: bytes) -> None:
    got = store.put("any.bin", data)
    assert store.read("any.bin") == data
    assert store.digest("any.bin") == (got["bytes"], got["sha256"]) == (len(data), hashlib.sha256(data).hexdigest())


def test_a_put_whose_writer_raises_leaves_the_key_as_it_was(store: Store) -> None:
    def broken(f: BinaryIO) -> None:
        f.write(b"half of it")
        raise RuntimeError("the writer failed midway")

    with pytest.raises(RuntimeError, match="midway"):
        store.put("x/new.bin", broken)
    assert not store.exists("x/new.bin") and store.digest("x/new.bin") is None
    assert store.names("x") == []  # no temporary file either
    store.put("x/old.bin", b"the previous, whole file")
    with pytest.raises(RuntimeError, match="midway"):
        store.put("x/old.bin", broken)
    assert store.read("x/old.bin") == b"the previous, whole file"
    assert store.names("x") == ["old.bin"]


def test_an_s3_multipart_put_whose_writer_raises_is_aborted(s3: S3) -> None:
    """Past one part (5 MiB here) s3fs uploads parts as they fill; the failed put aborts the multipart upload."""
    prefix = uuid.uuid4().hex
    store = Store.open(f"s3://{BUCKET}/{prefix}", {**s3.options, "default_block_size": 5 << 20})

    def broken(f: BinaryIO) -> None:
        for _ in range(7):
            f.write(bytes(1 << 20))
        raise RuntimeError("the writer failed midway")

    with pytest.raises(RuntimeError, match="midway"):
        store.put("big.bin", broken)
    assert store.names() == [] and not store.exists("big.bin")
    uploads = s3.client.list_multipart_uploads(Bucket=BUCKET, Prefix=prefix).get("Uploads", [])
    assert uploads == []

    def whole(f: BinaryIO) -> None:
        for _ in range(7):
            f.write(bytes(1 << 20))

    got = store.put("big.bin", whole)
    assert got["bytes"] == 7 << 20 and store.digest("big.bin") == (got["bytes"], got["sha256"])


@settings(EXAMPLES)
@given(data=st.binary(min_size=1, max_size=2000), cuts=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1))))
def test_read_ranges_are_slices_of_read(store: Store, data: bytes, cuts: list[tuple[float, float]]) -> None:
    """Any ranges inside the file, empty and reversed ones included (those are empty, as slices are)."""
    store.put("r.bin", data)
    starts = [int(a * len(data)) for a, _ in cuts]
    ends = [int(b * len(data)) for _, b in cuts]
    whole = store.read("r.bin")
    assert store.read_ranges("r.bin", starts, ends) == [whole[s:e] for s, e in zip(starts, ends, strict=True)]


def test_read_ranges_far_apart_near_and_overlapping(store: Store) -> None:
    """Ranges more than the merge gap apart are separate requests, close ones one request: the same slices."""
    data = bytes(range(256)) * (13 << 12)  # 13 MiB
    store.put("big.bin", data)
    mib = 1 << 20
    cuts = [(5 * mib, 5 * mib + 9), (0, 10), (3, 7), (12 * mib, 13 * mib), (5, 2 * mib), (9 * mib, 9 * mib), (8, 4)]
    got = store.read_ranges("big.bin", [a for a, _ in cuts], [b for _, b in cuts])
    assert got == [data[a:b] for a, b in cuts]


def test_read_ranges_of_a_missing_file_raise(store: Store) -> None:
    with pytest.raises(FileNotFoundError):
        store.read_ranges("missing.bin", [0], [4])


def test_names_exists_remove_and_sub(store: Store) -> None:
    for name in ("a/1.bin", "a/2.bin", "a/b/3.bin", "top.bin"):
        store.put(name, name.encode())
    assert store.names() == ["a", "top.bin"]
    assert store.names("a") == ["1.bin", "2.bin", "b"]
    assert store.names("top.bin") == [] and store.names("nowhere") == []  # a file is no folder
    assert store.exists("a/1.bin") and store.exists("a") and not store.exists("a/9.bin")
    sub = store.sub("a")
    assert sub.names() == ["1.bin", "2.bin", "b"] and sub.read("b/3.bin") == b"a/b/3.bin"
    sub.put("4.bin", b"four")
    assert store.read("a/4.bin") == b"four"
    store.remove("a/1.bin")
    store.remove("a/1.bin")  # missing: nothing to do
    assert store.names("a") == ["2.bin", "4.bin", "b"]
    store.remove_tree("a")
    store.remove_tree("a")
    assert store.names() == ["top.bin"] and not store.exists("a/b/3.bin")


def test_s3_listings_see_objects_other_processes_write(s3: S3) -> None:
    """Nothing is answered from a stale listing: a cluster's workers write into the root the driver lists."""
    prefix = uuid.uuid4().hex
    store = Store.open(f"s3://{BUCKET}/{prefix}", s3.options)
    store.put("commits/a.json", b"{}")
    assert store.names("commits") == ["a.json"] and not store.exists("commits/b.json")
    s3.client.put_object(Bucket=BUCKET, Key=f"{prefix}/commits/b.json", Body=b"{}")
    assert store.names("commits") == ["a.json", "b.json"] and store.exists("commits/b.json")
    s3.client.delete_object(Bucket=BUCKET, Key=f"{prefix}/commits/a.json")
    assert store.names("commits") == ["b.json"] and not store.exists("commits/a.json")


def test_open_creates_a_local_folder_and_refuses_one_under_a_file(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "new" / "root")
    assert store.local and (tmp_path / "new" / "root").is_dir()
    (tmp_path / "file").write_text("x")
    with pytest.raises(StoreError) as err:
        Store.open(tmp_path / "file" / "root")
    assert_refusal(err.value, str(tmp_path / "file" / "root"), "cannot create it")


def test_open_keeps_the_callers_options(s3: S3) -> None:
    """The probe's short timeouts are the probe's: the store works under the options it was given."""
    store = Store.open(f"s3://{BUCKET}/{uuid.uuid4().hex}", s3.options)
    assert store.storage_options == s3.options


def assert_refusal(err: StoreError, url: str, says: str) -> None:
    """One line, naming the root (without its credentials), saying why, and showing no secret."""
    text = str(err)
    assert "\n" not in text
    assert text.startswith(f"build root {redact_url(url)}: "), text
    assert says in text, text
    assert "SECRET" not in text and "SECRET" not in repr(err), text
    assert err.__cause__ is None


@pytest.mark.parametrize("url", ["nosuch://x/y", f"nosuch://AKIAFAKE:{SECRET}@x/y"])
def test_open_refuses_an_unknown_protocol(url: str) -> None:
    with pytest.raises(StoreError) as err:
        Store.open(url, {"secret": SECRET})
    assert_refusal(err.value, url, "no fsspec filesystem for nosuch://")


def test_open_refuses_a_missing_bucket(s3: S3) -> None:
    with pytest.raises(StoreError) as err:
        Store.open("s3://no-such-bucket/x", s3.options)
    assert_refusal(err.value, "s3://no-such-bucket/x", "no bucket 'no-such-bucket'")


def test_open_refuses_an_unreachable_endpoint_within_seconds(s3: S3) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {
        **s3.with_credentials("AKIAFAKE", SECRET),
        "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"},
    }
    t0 = time.monotonic()
    with pytest.raises(StoreError) as err:
        Store.open(f"s3://{BUCKET}/x", options)
    assert time.monotonic() - t0 < 5
    assert_refusal(err.value, f"s3://{BUCKET}/x", "unreachable")


@pytest.mark.parametrize("key", ["AKIAFAKE", "real"])
def test_open_refuses_refused_credentials(s3: S3, key: str) -> None:
    """An unknown key, and the real key with a wrong secret."""
    options = s3.with_credentials(s3.options["key"] if key == "real" else key, SECRET)
    with pytest.raises(StoreError) as err:
        Store.open(f"s3://{BUCKET}/x", options)
    assert_refusal(err.value, f"s3://{BUCKET}/x", "access refused")


@pytest.mark.parametrize("secret", [SECRET, "SUPER/SECRET", "SUPER+SECRET/x"])
def test_open_refuses_credentials_in_an_s3_url(s3: S3, secret: str) -> None:
    url = f"s3://AKIAFAKE:{secret}@{BUCKET}/x"
    assert redact_url(url) == f"s3://***@{BUCKET}/x"
    with pytest.raises(StoreError) as err:
        Store.open(url, s3.options)
    assert_refusal(err.value, url, "does not read credentials from the URL")
