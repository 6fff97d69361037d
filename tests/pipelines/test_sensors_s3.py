"""The source sensor on a real local S3 endpoint (moto_server on 127.0.0.1): a new object triggers once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from pipelines.definitions import load_definitions
from tests.conftest import moto_endpoint

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
