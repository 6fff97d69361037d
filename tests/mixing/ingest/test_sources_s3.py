"""Sources on a real local S3 endpoint (moto_server on 127.0.0.1): index, fingerprints, every format."""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from mixing.ingest.sources import index_source, read_records
from mixing.mixfile.mix import parse_mix
from mixing.output.layout import BuildLayout
from tests.conftest import moto_endpoint


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    with moto_endpoint() as url:
        yield url


@pytest.fixture
def s3_env(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    for k, v in {
        "AWS_ENDPOINT_URL": s3_endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch.setenv(k, v)
    return {"endpoint_url": s3_endpoint, "key": "testing", "secret": "testing"}


def upload(opts: dict[str, object], bucket: str, files: dict[str, bytes]) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(**opts, skip_instance_cache=True)  # type: ignore[arg-type]
    if not fs.exists(bucket):
        fs.mkdir(bucket)
    for key, data in files.items():
        fs.pipe(f"{bucket}/{key}", data)


def parquet_bytes(rows: Sequence[Mapping[str, object]]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


MIX = """
name: s3mix
tokenizer: {kind: bytes}
sequence: {length: 64, global_batch: 2}
sources:
  qa: {uri: "s3://corp/qa/*.jsonl*", format: jsonl, template: "{q} {a}"}
  chat: {uri: "s3://corp/chat/*.parquet", format: parquet, messages: messages}
curriculum:
  - {phase: p, steps: 2, mixture: {qa: 0.5, chat: 0.5}}
"""


def test_s3_index_and_read_every_record(s3_env: dict[str, object]) -> None:
    qa = "".join(json.dumps({"q": f"q{i}", "a": f"a{i}"}) + "\n" for i in range(30)).encode()
    chat = [{"messages": [{"role": "user", "content": f"hi {i}"}]} for i in range(12)]
    upload(
        s3_env, "corp", {"qa/a.jsonl": qa, "qa/b.jsonl.gz": gzip.compress(qa), "chat/c.parquet": parquet_bytes(chat)}
    )
    mix = parse_mix(MIX)
    idx = index_source(mix, "qa", s3_env)
    assert idx["path"].to_list() == ["s3://corp/qa/a.jsonl", "s3://corp/qa/b.jsonl.gz"]
    assert idx["fingerprint"].n_unique() == 2
    texts = [r.text for p in idx["path"] for r in read_records(p, mix.sources["qa"], s3_env)]
    assert texts == [f"q{i} a{i}" for i in range(30)] * 2
    idx = index_source(mix, "chat", s3_env)
    recs = list(read_records(idx["path"][0], mix.sources["chat"], s3_env))
    assert [r.text for r in recs] == [f"<|im_start|>user\nhi {i}<|im_end|>\n" for i in range(12)]


def test_s3_build_through_the_pipeline_with_env_credentials(s3_env: dict[str, object], tmp_path: Path) -> None:
    """The Dagster resource takes endpoint and credentials from AWS_* (never from the mix file)."""
    from mixing.ingest.documents import open_documents
    from pipelines.build import build_mix

    qa = "".join(json.dumps({"q": f"q{i}", "a": f"a{i}"}) + "\n" for i in range(30)).encode() + b"{bad\n"
    chat = [{"messages": [{"role": "user", "content": f"hi {i}"}]} for i in range(12)]
    upload(s3_env, "corp2", {"qa/a.jsonl": qa, "chat/c.parquet": parquet_bytes(chat)})
    assert "AWS_ENDPOINT_URL" in os.environ
    mix = parse_mix(MIX.replace("s3://corp/", "s3://corp2/"))
    build_mix(mix, tmp_path / "b", say=lambda _s: None)
    layout = BuildLayout(tmp_path / "b")
    assert len(open_documents(layout.source_dir("chat")).docs) == 12
    qa_docs = open_documents(layout.source_dir("qa")).docs
    assert qa_docs["file"].unique().to_list() == ["s3://corp2/qa/a.jsonl"]
    assert len(qa_docs) == 30
    q = [json.loads(x) for x in (layout.source_dir("qa") / "quarantine.jsonl").read_text().splitlines()]
    assert [(x["reason"], x["line"]) for x in q] == [("invalid JSON", 31)]
    assert layout.manifest.exists()


def test_s3_every_format(s3_env: dict[str, object], tmp_path: Path) -> None:
    import tarfile

    import zstandard

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "m.py").write_text("print('hi')\n")
    with tarfile.open(tmp_path / "code.tar", "w") as t:
        t.add(tmp_path / "src" / "m.py", "src/m.py")
    lines = "".join(json.dumps({"text": f"z{i}"}) + "\n" for i in range(5)).encode()
    upload(
        s3_env,
        "formats",
        {
            "z/a.jsonl.zst": zstandard.ZstdCompressor().compress(lines),
            "c/t.csv": b"text,x\nrow one,1\nrow two,2\n",
            "t/book.txt": b"para one\n\npara two\n",
            "code/code.tar": (tmp_path / "code.tar").read_bytes(),
            "code/loose.rs": b"fn main() {}\n",
        },
    )
    mix = parse_mix(
        """
name: f
tokenizer: {kind: bytes}
sequence: {length: 64, global_batch: 2}
sources:
  z: {uri: "s3://formats/z/*.zst", format: jsonl}
  c: {uri: "s3://formats/c/*.csv", format: csv}
  t: {uri: "s3://formats/t/*.txt", format: text, separator: "\\n\\n"}
  code: {uri: "s3://formats/code", format: code}
curriculum:
  - {phase: p, steps: 1, mixture: {z: 0.25, c: 0.25, t: 0.25, code: 0.25}}
"""
    )

    def texts(name: str) -> list[str | None]:
        idx = index_source(mix, name, s3_env)
        return [r.text for p in idx["path"] for r in read_records(p, mix.sources[name], s3_env)]

    assert texts("z") == [f"z{i}" for i in range(5)]
    assert texts("c") == ["row one", "row two"]
    assert texts("t") == ["para one", "para two\n"]
    assert texts("code") == ["print('hi')\n", "fn main() {}\n"]
