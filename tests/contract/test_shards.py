"""The shard format: dtypes, manifest fields, atomic writes under SIGKILL, corruption detection, s3://."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from contract.shards import FORMAT_VERSION, ShardError, ShardSet
from mixing import stages
from mixing.ingest.tokenizer import load_tokenizer
from mixing.mixfile.mix import load_mix
from mixing.output.layout import BuildLayout
from mixing.output.shard_writer import token_dtype, write_shards
from mixing.pack.packed import write_packed
from mixing.pack.packing import stream_plan
from mixing.report import inspect_build
from tests.conftest import ROOT, moto_endpoint
from tests.mixing.pack.test_packing import _build


def _toy(n: int = 5, seq_len: int = 16, high: int = 70000) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    counts = rng.integers(1, 4, n)
    offs = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    segs = []
    for c in counts:
        lens = np.full(c, seq_len // c)
        segs += [(int(rng.integers(0, 2)), int(rng.integers(0, 100)), 0, int(x)) for x in lens]
    tokens = rng.integers(0, high, (n, seq_len)).astype(token_dtype(high))
    return tokens, np.arange(n, dtype=np.int64) // 2, offs, np.array(segs, dtype=np.int64)


def test_dtype_follows_the_vocabulary() -> None:
    assert token_dtype(1 << 16) is np.uint16 and token_dtype((1 << 16) + 1) is np.uint32


@pytest.mark.parametrize("high", [50000, 200000])
def test_round_trip_and_manifest_fields(tmp_path: Path, high: int) -> None:
    tokens, step, offs, segs = _toy(high=high)
    m = write_shards(tmp_path, tokens, step, offs, segs, 2, {"cost": {"attention": 1.0, "linear": 2.0}, "mix": "x"})
    s = ShardSet(tmp_path)
    assert m.format_version == FORMAT_VERSION and m.sequences == 5 and m.seq_len == 16 and m.mix == "x"
    assert m.dtype == ("uint16" if high <= 1 << 16 else "uint32") and len(m.shards) == 3
    assert all(f.bytes > 0 and len(f.sha256) == 64 and f.name for sh in m.shards for f in sh.files.both())
    for i in range(5):
        v = s.sequence(i)
        assert np.array_equal(v.tokens, tokens[i]) and np.array_equal(v.segments, segs[offs[i] : offs[i + 1]])
        assert v.cu_seqlens[-1] == segs[offs[i] : offs[i + 1], 3].sum()
        length = v.segments[:, 3].astype(float)
        assert v.seg_cost is not None and np.allclose(v.seg_cost, length**2 + 2 * length)
    length = segs[:, 3].astype(float)
    cum = np.concatenate([[0.0], np.cumsum(length**2 + 2 * length)])
    assert np.allclose(s.seq_cost, cum[offs[1:]] - cum[offs[:-1]])
    assert np.array_equal(s.steps, step) and s.verify() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f.name for sh in m.shards for f in sh.files.both()] + ["manifest.json", "step_digests.bin"]
    )


def test_a_flipped_byte_is_reported_by_name(tiny_mix_path: Path, tmp_path: Path) -> None:
    layout = _build(tiny_mix_path, tmp_path / "b")
    name = ShardSet(layout.shards_dir).manifest.shards[0].files.tokens.name
    p = layout.shards_dir / name
    data = bytearray(p.read_bytes())
    data[-3] ^= 0x01
    p.write_bytes(bytes(data))
    assert inspect_build(layout.root).corrupt_files == (name,)


KILLED_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import mixing.pack.packed
    mixing.pack.packed._SHARD_TOKENS = 64 * 2  # two sequences per shard: many shards
    from mixing import stages
    from mixing.output.layout import BuildLayout
    from mixing.mixfile.mix import load_mix

    def on_shard(k):
        print(f"shard {k}", flush=True)
        if k == 2:
            time.sleep(120)  # killed here, in the middle of the build

    stages.pack(load_mix(sys.argv[1]), BuildLayout(Path(sys.argv[2])), on_shard=on_shard)
    """
)


def test_sigkill_while_writing_leaves_nothing_trusted_and_a_rerun_completes(
    tiny_mix_path: Path, tmp_path: Path
) -> None:
    layout = _build(tiny_mix_path, tmp_path / "b")
    clean = ShardSet(layout.shards_dir).manifest
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(tiny_mix_path), str(layout.root)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "shard 2":
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert len(list(layout.shards_dir.glob("shard-*"))) > 0  # it did write shards ...
    with pytest.raises(ShardError, match="no manifest"):
        ShardSet(layout.shards_dir)  # ... but no reader trusts them
    (layout.shards_dir / ".shard-00009.tokens.npy.abc.tmp").write_bytes(b"half")  # a file cut mid-write
    stages.pack(load_mix(tiny_mix_path), layout)
    again = ShardSet(layout.shards_dir)
    assert again.verify() == [] and again.manifest.shards == clean.shards
    assert sorted(p.name for p in layout.shards_dir.iterdir()) == sorted(
        [f.name for sh in clean.shards for f in sh.files.both()] + ["manifest.json", "step_digests.bin"]
    )


@pytest.fixture
def s3_endpoint() -> Iterator[str]:
    with moto_endpoint() as url:
        yield url


def test_s3_write_read_and_verify(s3_endpoint: str, tmp_path: Path) -> None:
    import s3fs

    opts = {
        "key": "testing",
        "secret": "testing",
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "eu-west-1"},
    }
    fs = s3fs.S3FileSystem(**opts)
    fs.mkdir("weir-test")
    tokens, step, offs, segs = _toy()
    local = write_shards(tmp_path, tokens, step, offs, segs, 2, {"cost": {}})
    remote = write_shards("s3://weir-test/b/shards", tokens, step, offs, segs, 2, {"cost": {}}, storage_options=opts)
    assert remote.shards == local.shards  # same bytes, same checksums
    s = ShardSet("s3://weir-test/b/shards", storage_options=opts)
    assert s.verify() == [] and len(s) == 5
    for i in range(5):
        assert np.array_equal(s.sequence(i).tokens, tokens[i])
    assert not [p for p in fs.ls("weir-test/b/shards") if p.endswith(".tmp")]
    name = remote.shards[1].files.meta.name
    data = bytearray(fs.cat_file(f"weir-test/b/shards/{name}"))
    data[10] ^= 0xFF
    fs.pipe_file(f"weir-test/b/shards/{name}", bytes(data))
    assert ShardSet("s3://weir-test/b/shards", storage_options=opts).verify() == [name]
    tok = remote.shards[0].files.tokens.name
    fs.pipe_file(f"weir-test/b/shards/{tok}", fs.cat_file(f"weir-test/b/shards/{tok}")[:40])  # cut in its header
    with pytest.raises(ShardError, match=rf"^s3://weir-test/b/shards/{tok}: not a readable \.npy file"):
        ShardSet("s3://weir-test/b/shards", storage_options=opts).shard_tokens(0)
    fs.pipe_file("weir-test/b/shards/manifest.json", fs.cat_file("weir-test/b/shards/manifest.json")[:-30])
    with pytest.raises(ShardError, match=r"^s3://weir-test/b/shards/manifest\.json: not valid JSON"):
        ShardSet("s3://weir-test/b/shards", storage_options=opts)
    with pytest.raises(ShardError, match="no manifest"):
        ShardSet("s3://weir-test/nothing", storage_options=opts)


def test_a_build_packs_straight_to_s3(s3_endpoint: str, tiny_mix_path: Path, tmp_path: Path) -> None:
    opts = {"key": "k", "secret": "s", "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "eu-west-1"}}
    import s3fs

    s3fs.S3FileSystem(**opts).mkdir("weir-build")
    layout = _build(tiny_mix_path, tmp_path / "b")
    mix = load_mix(tiny_mix_path)
    tok = load_tokenizer(mix.tokenizer, layout.tokenizer_dir)
    packing = stream_plan(layout.duckdb, mix.sequence.length, mix.sequence.global_batch, cost=mix.balance.cost.model())
    url = "s3://weir-build/tiny/shards"
    write_packed(mix, layout, packing, tok.fingerprint, tok.vocab_size, tok.eos_id, out=url, storage_options=opts)
    local, remote = ShardSet(layout.shards_dir), ShardSet(url, storage_options=opts)
    assert remote.manifest.shards == local.manifest.shards and remote.verify() == []
    assert all(np.array_equal(remote.sequence(i).tokens, local.sequence(i).tokens) for i in range(len(local)))


def test_a_killed_build_of_a_tiny_mix_through_stages_is_not_readable(tiny_mix_path: Path, tmp_path: Path) -> None:
    # a build interrupted before pack ran has no shards folder at all: the reader says so by name
    mix = load_mix(tiny_mix_path)
    layout = BuildLayout(tmp_path / "b")
    for name in mix.sources:
        stages.index(mix, layout, name)
    with pytest.raises(ShardError, match="manifest"):
        ShardSet(layout.shards_dir)


def test_format_1_builds_still_read(tmp_path: Path) -> None:
    import json

    tokens, step, offs, segs = _toy(high=1000)
    m = write_shards(tmp_path, tokens, step, offs, segs, 10, {"cost": {"attention": 1.0, "linear": 0.0}})
    meta = tmp_path / m.shards[0].files.meta.name
    with np.load(meta) as z:
        old = {k: z[k] for k in ("step", "seg_offsets", "segments")}  # what format 1 wrote
    with meta.open("wb") as f:
        np.savez(f, **old)
    old_manifest = m.as_json()  # format 1 carried no checksum
    (tmp_path / "manifest.json").write_text(json.dumps({**old_manifest, "format_version": 1}))
    s = ShardSet(tmp_path)
    length = segs[:, 3].astype(float)
    per_seq = np.split(length, offs[1:-1])
    assert np.allclose(s.seq_cost, [float((x**2).sum()) for x in per_seq])
    assert np.array_equal(s.seq_tokens, [x.sum() for x in per_seq])


def test_the_manifest_carries_its_own_checksum(tmp_path: Path) -> None:
    import json

    from contract.manifest import CHECKSUM_FIELD, manifest_digest, write_manifest

    tokens, step, offs, segs = _toy()
    m = write_shards(tmp_path, tokens, step, offs, segs, 2, {"cost": {"attention": 1.0, "linear": 0.0}, "pad_id": 3})
    p = tmp_path / "manifest.json"
    sealed = {**m.as_json(), CHECKSUM_FIELD: m.manifest_sha256}
    assert m.manifest_sha256 == manifest_digest(m.as_json()) == manifest_digest(json.loads(p.read_text()))
    assert json.loads(p.read_text()) == sealed
    assert ShardSet(tmp_path).sealed
    p.write_text(json.dumps(json.loads(p.read_text()), indent=None))  # other whitespace, same content: still reads
    assert ShardSet(tmp_path).manifest == m
    for edit in ({"pad_id": 4}, {"cost": {"attention": 1.0, "linear": 1.0}}, {"note": "hand-written"}):
        p.write_text(json.dumps({**sealed, **edit}))
        with pytest.raises(
            ShardError, match=rf"^{tmp_path}/manifest\.json: content does not match its manifest_sha256"
        ):
            ShardSet(tmp_path)
    for edit in ({"pad_id": 4}, {"cost": {"attention": 1.0, "linear": 1.0}}, {"mix": "hand-written"}):
        write_manifest(tmp_path, {**sealed, **edit})  # a change made on purpose is written with a new checksum
        assert ShardSet(tmp_path).manifest.as_json() == {**m.as_json(), **edit}
        assert ShardSet(tmp_path).manifest.manifest_sha256 == manifest_digest({**m.as_json(), **edit})
    with pytest.raises(ShardError, match=r"manifest\.json: note: not a field of the manifest"):
        write_manifest(tmp_path, {**sealed, "note": "hand-written"})  # a writer is held to the declared fields


@pytest.mark.parametrize("per_shard", [1, 2, 10])
def test_the_index_holds_the_shards_metadata_as_mappable_arrays(tmp_path: Path, per_shard: int) -> None:
    import mmap

    from contract.index import item_cu_seqlens, map_index, write_index

    tokens, step, offs, segs = _toy(n=7)
    segs[::3, 3] -= 1  # some sequences end in padding
    write_shards(tmp_path / "b", tokens, step, offs, segs, per_shard, {"cost": {"attention": 2.0, "linear": 1.0}})
    plain, indexed = ShardSet(tmp_path / "b"), ShardSet(tmp_path / "b")
    (tmp_path / "ix").mkdir()
    record = write_index(plain, tmp_path / "ix", "0" * 64, meta_verified=False)
    assert all(len(f["sha256"]) == 64 for f in record["files"].values())
    indexed.use_index(tmp_path / "ix")
    assert np.array_equal(indexed.steps, plain.steps) and np.array_equal(indexed.seq_tokens, plain.seq_tokens)
    assert np.array_equal(indexed.seq_cost, plain.seq_cost)
    assert all(np.array_equal(a, b) for a, b in zip(indexed.segments, plain.segments, strict=True))
    for i in range(len(plain)):
        a, b = indexed.sequence(i), plain.sequence(i)
        assert (a.step, a.tokens.tolist(), a.segments.tolist()) == (b.step, b.tokens.tolist(), b.segments.tolist())
        assert a.seg_cost is not None and b.seg_cost is not None and np.array_equal(a.seg_cost, b.seg_cost)
    ix = map_index(tmp_path / "ix", len(plain))
    assert isinstance(ix["segments"].base, np.memmap) and isinstance(ix["segments"].base.base, mmap.mmap)
    cu, count = item_cu_seqlens(offs, segs[:, 3], plain.seq_tokens, 16)
    assert np.array_equal(ix["cu_seqlens"], cu) and np.array_equal(np.diff(ix["cu_offsets"]), count)
    for i in range(len(plain)):  # each sequence's boundaries, its padding (if any) one more segment
        lens = plain.sequence(i).segments[:, 3].tolist()
        want = np.cumsum([0, *lens, *([16 - sum(lens)] if sum(lens) < 16 else [])])
        assert ix["cu_seqlens"][ix["cu_offsets"][i] : ix["cu_offsets"][i + 1]].tolist() == want.tolist()
    (tmp_path / "ix" / "step.npy").write_bytes((tmp_path / "ix" / "seq_cost.npy").read_bytes())  # float64, not int64
    with pytest.raises(ShardError, match=r"ix: index unusable .*step\.npy: holds float64"):
        ShardSet(tmp_path / "b").use_index(tmp_path / "ix")
