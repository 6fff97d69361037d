"""``weir inspect`` on a damaged build: every kind of damage ends in exit 1 and one line naming the file.

Each case copies one real build of the tiny mix, damages one file, and runs ``python -m pipelines.cli
inspect`` as a subprocess (what a user runs): exit 1, no traceback, one line on stderr naming the file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from contract.shards import ShardError, ShardSet
from mixing.output.layout import BuildLayout
from mixing.report import inspect_build
from tests.conftest import ROOT, TINY_MIX, write_tiny_sources
from tests.mixing.pack.test_packing import _build

TOKENS, META, MANIFEST, DB = "shard-00000.tokens.npy", "shard-00000.meta.npz", "manifest.json", "weir.duckdb"


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("tiny")
    write_tiny_sources(base / "data")
    (base / "tiny.yaml").write_text(TINY_MIX.format(root=base / "data"))
    return _build(base / "tiny.yaml", base / "build").root


def inspect(build: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pipelines.cli", "inspect", str(build), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.fixture(scope="module")
def undamaged(tiny_build: Path) -> subprocess.CompletedProcess[str]:
    """``weir inspect --json`` of the undamaged build (checked by one test, compared with by another)."""
    return inspect(tiny_build, "--json")


# -- kinds of damage: each takes the build's root and damages one file ------------------------------------


def flip(name: str, where: Callable[[bytes], int]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        p = root / "shards" / name
        data = bytearray(p.read_bytes())
        data[where(bytes(data))] ^= 0x01
        p.write_bytes(bytes(data))

    return damage


def truncate(name: str, keep: float) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        p = root / name if name == DB else root / "shards" / name
        p.write_bytes(p.read_bytes()[: int(p.stat().st_size * keep)])

    return damage


def delete(name: str) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        (root / name if name == DB else root / "shards" / name).unlink()

    return damage


def edit(change: Callable[[dict], None], reseal: bool = False) -> Callable[[Path], None]:
    """Change the manifest's fields; with ``reseal``, write it with a fresh checksum of its own (a manifest
    consistent with its checksum but wrong, as a buggy writer would leave it: ``write_manifest`` would refuse
    to write it)."""

    def damage(root: Path) -> None:
        from contract.manifest import seal

        p = root / "shards" / MANIFEST
        m = json.loads(p.read_text())
        change(m)
        p.write_text(json.dumps(seal(m) if reseal else m, indent=2, sort_keys=True) + "\n")

    return damage


def short_step_array(root: Path) -> None:
    """meta.npz rewritten with a step array one short, its new size and sha256 put in a resealed manifest."""
    import hashlib

    import numpy as np

    from contract.manifest import write_manifest

    p = root / "shards" / META
    with np.load(p) as z:
        meta = {k: z[k] for k in z.files}
    with p.open("wb") as f:
        np.savez(f, **{**meta, "step": meta["step"][:-1]})
    m = json.loads((root / "shards" / MANIFEST).read_text())
    m["shards"][0]["files"]["meta"].update(bytes=p.stat().st_size, sha256=hashlib.sha256(p.read_bytes()).hexdigest())
    write_manifest(root / "shards", m)


def npy_shape_digit(data: bytes) -> int:
    return data.index(b"'shape': (") + len(b"'shape': (")  # first digit of the shape in the .npy header


DAMAGE: dict[str, tuple[Callable[[Path], object], str]] = {  # damage a build's folder (what it returns is unused)
    "npy magic byte flipped": (flip(TOKENS, lambda d: 0), TOKENS),
    "npy header shape flipped": (flip(TOKENS, npy_shape_digit), TOKENS),
    "npy header dtype flipped": (flip(TOKENS, lambda d: d.index(b"<u2") + 2), TOKENS),
    "npy data byte flipped": (flip(TOKENS, lambda d: len(d) - 3), TOKENS),
    "npy truncated": (truncate(TOKENS, 0.5), TOKENS),
    "npy emptied": (truncate(TOKENS, 0.0), TOKENS),
    "npy deleted": (delete(TOKENS), TOKENS),
    "npz local header flipped": (flip(META, lambda d: 0), META),
    "npz member byte flipped": (flip(META, lambda d: len(d) // 2), META),
    "npz central directory flipped": (flip(META, lambda d: d.rindex(b"PK\x05\x06")), META),
    "npz truncated": (truncate(META, 0.5), META),
    "npz deleted": (delete(META), META),
    "npz resealed with a short array": (short_step_array, META),
    "manifest unparsable": (truncate(MANIFEST, 0.5), MANIFEST),
    "manifest emptied": (truncate(MANIFEST, 0.0), MANIFEST),
    "manifest not an object": (lambda r: (r / "shards" / MANIFEST).write_text("[1, 2]\n"), MANIFEST),
    "manifest binary garbage": (lambda r: (r / "shards" / MANIFEST).write_bytes(b"\xff\xfe\x00\x93NUMPY"), MANIFEST),
    "manifest deleted": (delete(MANIFEST), MANIFEST),
    "manifest pad_id edited": (edit(lambda m: m.update(pad_id=0)), MANIFEST),
    "manifest cost edited": (edit(lambda m: m["cost"].update(linear=0.0)), MANIFEST),
    "manifest global_batch edited": (edit(lambda m: m.update(global_batch=8)), MANIFEST),
    "manifest shard size edited": (edit(lambda m: m["shards"][0]["files"]["tokens"].update(bytes=1)), MANIFEST),
    "manifest field removed": (edit(lambda m: m.pop("shards")), MANIFEST),
    "manifest checksum removed": (edit(lambda m: m.pop("manifest_sha256")), MANIFEST),
    "manifest resealed without seq_len": (edit(lambda m: m.pop("seq_len"), reseal=True), MANIFEST),
    "manifest resealed with a string count": (edit(lambda m: m.update(sequences="32"), reseal=True), MANIFEST),
    "manifest resealed with version 99": (edit(lambda m: m.update(format_version=99), reseal=True), MANIFEST),
    "manifest resealed with a path": (
        edit(lambda m: m["shards"][0]["files"]["meta"].update(name="../weir.duckdb"), reseal=True),
        MANIFEST,
    ),
    "manifest resealed without mix": (edit(lambda m: m.pop("mix"), reseal=True), MANIFEST),
    "duckdb deleted": (delete(DB), DB),
    "duckdb truncated": (truncate(DB, 0.25), DB),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_every_kind_of_damage_exits_1_with_one_line_naming_the_file(
    tiny_build: Path, tmp_path: Path, kind: str
) -> None:
    damage, victim = DAMAGE[kind]
    copy = tmp_path / "b"
    shutil.copytree(tiny_build, copy)
    damage(copy)
    r = inspect(copy)
    assert r.returncode == 1, (kind, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and victim in lines[0], r.stderr


def test_an_undamaged_build_still_exits_0_with_the_same_figures(
    tiny_build: Path, undamaged: subprocess.CompletedProcess[str]
) -> None:
    r = undamaged
    assert r.returncode == 0 and r.stderr == "", r.stderr
    report = json.loads(r.stdout)
    m = ShardSet(BuildLayout(tiny_build).shards_dir).manifest
    assert m.steps is not None and m.global_batch is not None
    assert report == json.loads(json.dumps(inspect_build(tiny_build).as_json()))
    assert report["corrupt_files"] == [] and report["file_problems"] == {} and report["manifest_sealed"] is True
    assert report["sequences"] == m.steps * m.global_batch == 32 and report["steps"] == 8
    assert report["tokens"] == sum(s["tokens_packed"] for s in report["per_source"].values()) == 1735
    for name, s in report["per_source"].items():
        assert s["tokens_planned"] == s["tokens_packed"] + s["tokens_dropped"], name
    plain = inspect(tiny_build)
    assert plain.returncode == 0 and "32 sequences of 64 tokens, 1,735 tokens" in plain.stdout


def test_a_manifest_written_before_checksums_is_read_with_a_note(
    tiny_build: Path, undamaged: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    copy = tmp_path / "b"
    shutil.copytree(tiny_build, copy)
    p = copy / "shards" / MANIFEST
    m = json.loads(p.read_text())
    m.pop("manifest_sha256")
    p.write_text(json.dumps({**m, "format_version": 2}, indent=2, sort_keys=True) + "\n")  # what format 2 wrote
    r = inspect(copy, "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["manifest_sealed"] is False and report["format_version"] == 2
    sealed = json.loads(undamaged.stdout)
    new = ("format_version", "manifest_sealed")
    assert {k: v for k, v in report.items() if k not in new} == {k: v for k, v in sealed.items() if k not in new}
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and MANIFEST in lines[0] and "manifest_sha256" in lines[0] and "format 2" in lines[0]


@pytest.mark.parametrize("kind", ["manifest pad_id edited", "manifest unparsable", "npz truncated"])
def test_every_reader_of_the_build_gets_the_same_validation(tiny_build: Path, tmp_path: Path, kind: str) -> None:
    from loaders import PackedDataset, World

    damage, victim = DAMAGE[kind]
    copy = tmp_path / "b"
    shutil.copytree(tiny_build, copy)
    damage(copy)
    readers: list[Callable[[], object]] = [
        lambda: ShardSet(copy / "shards").segments,
        lambda: inspect_build(copy),
        lambda: next(iter(PackedDataset(copy, world=World(0, 2)))),
    ]
    for read in readers:
        with pytest.raises(ShardError, match=victim.replace(".", r"\.")) as e:
            read()
        assert len(str(e.value).splitlines()) == 1


SHARD_FILE_DAMAGE = sorted(k for k, (_, victim) in DAMAGE.items() if victim in (TOKENS, META))


@pytest.mark.parametrize("kind", SHARD_FILE_DAMAGE)
def test_reading_a_damaged_shard_names_it_even_without_checksums(tiny_build: Path, tmp_path: Path, kind: str) -> None:
    """What a loader meets when it reads without checking sha256 first: a ShardError naming the file, or, for
    a flipped data byte (no structure to break), ``verify`` naming it."""
    damage, victim = DAMAGE[kind]
    copy = tmp_path / "b"
    shutil.copytree(tiny_build, copy)
    damage(copy)
    shards = ShardSet(copy / "shards")
    try:
        shards.segments, shards.steps, shards.seq_cost, shards.shard_tokens(0)
    except ShardError as e:
        assert len(str(e).splitlines()) == 1 and f"{copy / 'shards' / victim}: " in str(e), str(e)
        assert "pickle" not in str(e)  # numpy's advice to load an unknown file unsafely is not passed on
    else:
        assert kind == "npy data byte flipped" and shards.verify() == [victim]
