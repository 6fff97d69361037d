"""Stage commit records on a local folder and on a real S3 endpoint: round trip, any damaged byte makes a record
unreadable, verify names what changed under a record, committed() lists damaged records by name."""

from __future__ import annotations

import json
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.store import Store
from mixing.output.commit import COMMITS, Commit, commit, committed, read_commit, uncommit, verify
from tests.contract.conftest import BUCKET, S3

# JSON turns tuples into lists and int keys into strings (which sort otherwise: "10" < "2")
SUMMARY = {"sequences": 12, "tokens": 3.5, "shape": (2, 3), "per_step": {1: 4, 10: 2, 2: 1}, "note": "é ✓"}
PLAIN = {"sequences": 12, "note": "é ✓"}  # what JSON reads back as written


def publish(store: Store, stage: str, partition: str | None = None, summary: dict = PLAIN) -> Commit:
    """Two files of ``stage`` written through the store, then its record."""
    where = f"{stage}/{partition}" if partition else stage
    files = [store.put(f"{where}/a.bin", b"alpha" * 10), store.put(f"{where}/b.bin", b"beta")]
    return commit(store, stage, partition, files, summary)


def test_a_record_reads_back_as_committed(store: Store) -> None:
    c = publish(store, "tokenize", summary=SUMMARY)
    assert c.name == f"{COMMITS}/tokenize.json"
    assert c.files == {
        "tokenize/a.bin": store.digest("tokenize/a.bin"),
        "tokenize/b.bin": store.digest("tokenize/b.bin"),
    }
    assert read_commit(store, "tokenize", None) == c
    assert c.summary == {
        "sequences": 12,
        "tokens": 3.5,
        "shape": [2, 3],
        "per_step": {"1": 4, "10": 2, "2": 1},
        "note": "é ✓",
    }
    p = publish(store, "chunk", "web")
    assert p.name == f"{COMMITS}/chunk/web.json" and read_commit(store, "chunk", "web") == p
    assert read_commit(store, "chunk", "books") is None and read_commit(store, "chunk", None) is None
    assert sorted(committed(store), key=lambda x: x.name if isinstance(x, Commit) else x) == [p, c]
    assert verify(store, c) == [] and verify(store, p) == [] and verify(store, c, deep=False) == []
    uncommit(store, "tokenize", None)
    uncommit(store, "tokenize", None)  # nothing left to remove
    assert read_commit(store, "tokenize", None) is None and committed(store) == [p]


def test_a_record_of_another_stage_or_partition_is_not_this_ones(store: Store) -> None:
    publish(store, "chunk", "web")
    store.put(f"{COMMITS}/chunk/books.json", store.read(f"{COMMITS}/chunk/web.json"))
    store.put(f"{COMMITS}/other.json", store.read(f"{COMMITS}/chunk/web.json"))
    assert read_commit(store, "chunk", "books") is None and read_commit(store, "other", None) is None


def flipped(data: bytes, at: int, mask: int) -> bytes:
    out = bytearray(data)
    out[at] ^= mask
    return bytes(out)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(where=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255))
def test_a_record_with_any_byte_changed_reads_as_none(
    tmp_path_factory: pytest.TempPathFactory, where: float, mask: int
) -> None:
    store = Store.open(tmp_path_factory.mktemp("flip"))
    publish(store, "pack")
    data = store.read(f"{COMMITS}/pack.json")
    store.put(f"{COMMITS}/pack.json", flipped(data, int(where * len(data)), mask))
    assert read_commit(store, "pack", None) is None


@pytest.mark.parametrize("change", ["space to tab", "space to newline", "escape to upper case", "digit", "check"])
def test_a_record_changed_where_json_reads_the_same_reads_as_none(store: Store, change: str) -> None:
    """Whitespace and escapes are bytes JSON reads past: a record is its bytes, not what JSON makes of them."""
    publish(store, "pack")
    text = store.read(f"{COMMITS}/pack.json").decode()
    at = {
        "space to tab": (text.index(" "), "\t"),
        "space to newline": (text.index(" "), "\n"),
        "escape to upper case": (text.index("\\u00e9") + 4, "E"),
        "digit": (text.index('"sequences": 12') + 13, "3"),
        "check": (text.index('"check": "') + 10, "0" if text[text.index('"check": "') + 10] != "0" else "1"),
    }[change]
    changed = text[: at[0]] + at[1] + text[at[0] + 1 :]
    assert len(changed) == len(text) and changed != text
    if change.startswith(("space", "escape")):
        assert json.loads(changed) == json.loads(text)  # the change this test is about: one JSON reads past
    store.put(f"{COMMITS}/pack.json", changed.encode())
    assert read_commit(store, "pack", None) is None


def test_verify_names_a_missing_file_a_size_change_and_a_sha_change(store: Store) -> None:
    c = commit(
        store, "s", None, [store.put(f"s/{n}.bin", n.encode() * 20) for n in ("gone", "grown", "flipped", "kept")]
    )
    assert verify(store, c) == []
    store.remove("s/gone.bin")
    store.put("s/grown.bin", store.read("s/grown.bin") + b"!")
    store.put("s/flipped.bin", flipped(store.read("s/flipped.bin"), 33, 0x01))
    assert verify(store, c) == [
        "s/flipped.bin: sha256 differs from the commit record",
        "s/gone.bin: missing",
        "s/grown.bin: size differs from the commit record",
    ]
    assert verify(store, c, deep=False) == [  # reads no file: a same-size change is not seen
        "s/gone.bin: missing",
        "s/grown.bin: size differs from the commit record",
    ]


def test_committed_lists_damaged_records_by_name(store: Store) -> None:
    good = publish(store, "tokenize")
    web = publish(store, "chunk", "web")
    publish(store, "chunk", "books")
    publish(store, "pack")
    store.put(f"{COMMITS}/chunk/books.json", flipped(store.read(f"{COMMITS}/chunk/books.json"), 3, 0x20))
    store.put(f"{COMMITS}/pack.json", store.read(f"{COMMITS}/pack.json")[:-1])  # cut short
    store.put(f"{COMMITS}/stray.json", b"written by something else")
    store.put(f"{COMMITS}/chunk/.web.json.0123abcd.tmp", b"a writer's temporary file")
    found = committed(store)
    assert sorted(x for x in found if isinstance(x, str)) == [
        f"{COMMITS}/chunk/books.json",
        f"{COMMITS}/pack.json",
        f"{COMMITS}/stray.json",
    ]
    assert sorted((x for x in found if isinstance(x, Commit)), key=lambda x: x.name) == [web, good]


def test_nothing_committed_in_an_empty_root(store: Store) -> None:
    assert committed(store) == []


def test_a_record_unreadable_for_want_of_credentials_is_an_error_not_missing(s3: S3) -> None:
    """Only a missing record reads as None; a refused read must not look like "this stage never ran"."""
    prefix = uuid.uuid4().hex
    store = Store.open(f"s3://{BUCKET}/{prefix}", s3.options)
    publish(store, "pack")
    refused = Store(f"s3://{BUCKET}/{prefix}", s3.with_credentials(s3.options["key"], "WRONGSECRET"))
    with pytest.raises(PermissionError):
        read_commit(refused, "pack", None)
