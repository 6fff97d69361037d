"""``pipelines/sensors.py``: a source's digest is a function of its listing (files and fingerprints) alone, and
only that source's digest moves when its files change; the sensor, stopped until turned on, records a baseline
on its first tick and then asks one run per changed source exactly once per change (new, modified or removed
files), on local folders and on a real local S3 endpoint (moto_server on 127.0.0.1)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from mixing import load_mix
from pipelines.definitions import load_definitions
from pipelines.sensors import source_digests
from tests.conftest import moto_endpoint


def test_a_digest_follows_its_sources_files_and_nothing_else(tiny_mix_path: Path, tmp_path: Path) -> None:
    mix = load_mix(tiny_mix_path)
    first = source_digests(mix)
    assert sorted(first) == ["notes", "qa"] and "none" not in first.values()
    assert source_digests(mix) == first, "the same files: the same digests"
    notes = tmp_path / "data" / "notes"
    (notes / "n05.txt").write_text("rewritten, and longer than before\n")  # size and mtime change
    changed = source_digests(mix)
    assert changed["notes"] != first["notes"] and changed["qa"] == first["qa"]
    moved = tmp_path / "elsewhere"
    shutil.move(notes, moved)
    assert source_digests(mix) == {**changed, "notes": "none"}, "a source that matches nothing is a state too"
    shutil.move(moved, notes)
    assert source_digests(mix) == changed
    before = (notes / "n05.txt").stat()
    os.utime(notes / "n05.txt", ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))  # touched, not rewritten
    assert source_digests(mix)["notes"] != changed["notes"]


def test_the_sensor_is_stopped_until_turned_on(tmp_path: Path, tiny_mix_path: Path) -> None:
    repo = _tiny_defs(tmp_path, tiny_mix_path).get_repository_def()
    sensor = repo.get_sensor_def("sources_tiny")
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED and sensor.job_name == "build_tiny"


def _tiny_defs(tmp_path: Path, tiny_mix_path: Path) -> dg.Definitions:
    mixes = tmp_path / "mixes"
    mixes.mkdir(exist_ok=True)
    shutil.copy(tiny_mix_path, mixes / "tiny.yaml")
    return load_definitions(mixes, tmp_path / "build")


def test_source_sensor_triggers_exactly_once_per_change(tmp_path: Path, tiny_mix_path: Path) -> None:
    repo = _tiny_defs(tmp_path, tiny_mix_path).get_repository_def()
    sensor = repo.get_sensor_def("sources_tiny")

    def tick(cursor: str | None) -> tuple[list[dg.RunRequest], str | None]:
        data = sensor.evaluate_tick(dg.build_sensor_context(cursor=cursor, repository_def=repo))
        return list(data.run_requests or []), data.cursor

    first, cursor = tick(None)
    assert first == [] and cursor  # turning the sensor on records a baseline, rebuilds nothing
    assert tick(cursor)[0] == []
    notes = tmp_path / "data" / "notes"
    (notes / "n99.txt").write_text("A note that arrived later.\n")
    requests, cursor2 = tick(cursor)
    assert [(r.partition_key, r.tags["weir/source"]) for r in requests] == [("notes", "notes")]
    assert cursor2 != cursor
    assert tick(cursor2)[0] == []  # the same change never triggers twice
    qa = tmp_path / "data" / "qa.jsonl"
    qa.write_text(qa.read_text() + '{"q": "new?", "a": "yes"}\n')  # a modified file is a change too
    requests, cursor3 = tick(cursor2)
    assert [r.partition_key for r in requests] == ["qa"]
    (notes / "n99.txt").unlink()
    assert [r.partition_key for r in tick(cursor3)[0]] == ["notes"]  # and so is a removed one


MIX = """\
name: s3mix
seed: 1
tokenizer: {kind: bytes}
sequence: {length: 64, global_batch: 2}
sources:
  notes: {uri: "s3://corpus/notes/*.txt", format: text}
curriculum:
  - {phase: only, steps: 2, mixture: {notes: 1.0}}
"""


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """An s3fs filesystem on a fresh moto server, with the AWS_* variables set."""
    import s3fs

    with moto_endpoint() as endpoint:
        env = {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        fs = s3fs.S3FileSystem(endpoint_url=endpoint, key="testing", secret="testing", skip_instance_cache=True)
        fs.mkdir("corpus")
        yield fs


def test_sensor_sees_a_new_s3_object_exactly_once(s3, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    s3.pipe("corpus/notes/a.txt", b"first note\n")
    (tmp_path / "mixes").mkdir()
    (tmp_path / "mixes" / "s3mix.yaml").write_text(MIX)
    repo = load_definitions(tmp_path / "mixes", tmp_path / "build").get_repository_def()
    sensor = repo.get_sensor_def("sources_s3mix")

    def tick(cursor: str | None) -> tuple[list[dg.RunRequest], str | None]:
        data = sensor.evaluate_tick(dg.build_sensor_context(cursor=cursor, repository_def=repo))
        return list(data.run_requests or []), data.cursor

    _, cursor = tick(None)
    assert tick(cursor)[0] == []
    s3.pipe("corpus/notes/b.txt", b"a note written later\n")
    requests, cursor2 = tick(cursor)  # a listing cached by the previous tick must not hide the new object
    assert [r.partition_key for r in requests] == ["notes"]
    assert tick(cursor2)[0] == []
