"""``pipelines/kept_work.py``: the work a build keeps and reuses. A build killed while tokenizing keeps its work:
the next ``weir build`` makes the tokenized chunks of the staging folder it left the kept work (``.<out>.cache``)
and seeds from it, reusing them as the same files, while no chunk the kill interrupted, or left short, is trusted;
its output equals a build from scratch (real ``weir build`` subprocesses, killed with SIGKILL once some chunks are
written). Kept work is the cache only when it holds chunks; seeding skips killed writers' temporary files, keeps
one tokenizer and gives files the umask's mode. (A failed build's kept work: ``test_operator_retry.py``.)"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mixing import load_mix
from pipelines import transaction
from pipelines.kept_work import kept_work, reuse_previous, work_cache
from pipelines.transaction import build_output

ROOT = Path(__file__).resolve().parents[2]
WEIR = [sys.executable, "-m", "pipelines.cli"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}
SOURCES, FILES = 3, 1500  # 16 chunks a source: seconds of tokenizing, a kill lands in the middle of it

MANY_MIX = """\
name: many
seed: 7
tokenizer: {{kind: bytes}}
sequence: {{length: 64, global_batch: 4}}
sources:
{sources}
curriculum:
  - {{phase: first, steps: 4, mixture: {{s0: 0.5, s1: 0.25, s2: 0.25}}}}
"""


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A mix of 3 sources of 1500 small text files each (48 chunks), and its build from scratch."""
    base = tmp_path_factory.mktemp("many")
    lines = []
    for s in range(SOURCES):
        (base / "data" / f"s{s}").mkdir(parents=True)
        for i in range(FILES):
            words = " ".join(f"w{(i * 7 + k + s) % 97}" for k in range(200))
            (base / "data" / f"s{s}" / f"f{i:05d}.txt").write_text(words + "\n")
        lines.append(f'  s{s}: {{uri: "{base}/data/s{s}/*.txt", format: text, max_epochs: 50}}')
    mix = base / "many.yaml"
    mix.write_text(MANY_MIX.format(sources="\n".join(lines)))
    clean = build_output(load_mix(mix), base / "clean", fresh=True, say=lambda _s: None)
    return mix, Path(clean.dest)


def complete_chunks(folder: Path) -> dict[Path, int]:
    """The chunks published under their key (``report.json`` in), relative, with their tokens.bin's inode."""
    return {
        p.parent.relative_to(folder): (p.parent / "tokens.bin").stat().st_ino
        for p in folder.glob("sources/*/chunks/*/report.json")
        if not p.parent.name.startswith(".")
    }


def killed_mid_tokenizing(mix: Path, out: Path) -> Path:
    """Start ``weir build mix --out out``, SIGKILL it as soon as a chunk is complete; its staging folder."""
    p = subprocess.Popen(
        [*WEIR, "build", str(mix), "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=ENV,
    )
    stage = out.with_name(f".{out.name}.building-{p.pid}")
    try:
        deadline = time.monotonic() + 120
        while not complete_chunks(stage) and p.poll() is None:
            assert time.monotonic() < deadline, "timed out waiting for a complete chunk"
            time.sleep(0.005)
        p.send_signal(signal.SIGKILL)
    finally:
        p.kill()
        _, err = p.communicate()
    assert p.returncode == -signal.SIGKILL, f"the build ended before the kill: {err[-2000:]}"
    assert not out.exists()
    return stage


def weir_build(mix: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WEIR, "build", str(mix), "--out", str(out)], capture_output=True, text=True, cwd=ROOT)


def shards(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (out / "shards").iterdir()}


def manifest(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((out / "shards" / "manifest.json").read_text())


def beside(out: Path) -> set[str]:
    return {p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}") or p.name == out.name}


@pytest.mark.slow
def test_the_next_build_reuses_the_chunks_a_killed_build_wrote_and_equals_a_clean_build(
    many: tuple[Path, Path], tmp_path: Path
) -> None:
    mix, clean = many
    out = tmp_path / "out"
    stage = killed_mid_tokenizing(mix, out)
    kept = complete_chunks(stage)
    every = list(stage.glob("sources/*/chunks/*"))
    interrupted = [p for p in every if p.relative_to(stage) not in kept]
    # what the kill interrupted is never under a chunk's key: a writer's temporary folder, or absent
    assert all(p.name.startswith(".") and p.name.endswith(".tmp") for p in interrupted), interrupted
    assert 0 < len(kept) < len(complete_chunks(clean)), "killed mid-way through tokenizing"
    held = tmp_path / "held"  # a link to each file the kill interrupted keeps its inode from being reused
    held.mkdir()
    for i, f in enumerate(f for d in interrupted for f in d.rglob("*") if f.is_file()):
        os.link(f, held / str(i))
    partial_inodes = {f.stat().st_ino for f in held.iterdir()}

    r = weir_build(mix, out)
    assert r.returncode == 0, r.stderr
    cache = work_cache(out.resolve())
    n = f"{len(kept)} chunk{'s' if len(kept) != 1 else ''}"
    assert f"kept the tokenized work of a killed build in {cache} ({n}, " in r.stdout, r.stdout
    assert f"reusing the work a killed build kept in {cache}" in r.stdout
    assert "leftover" not in r.stdout, "the killed build's staging folder was kept, not removed"
    now = complete_chunks(out)
    reused = [rel for rel, ino in kept.items() if now.get(rel) == ino]
    assert len(reused) == len(kept) > 0, "every chunk the killed build wrote is reused as the same file"
    assert not partial_inodes & {f.stat().st_ino for f in out.rglob("*") if f.is_file()}, "no partial write kept"
    assert beside(out) == {"out"}, "the cache is removed once the build succeeds"
    assert manifest(out) == manifest(clean)
    assert shards(out) == shards(clean)


@pytest.mark.slow
def test_a_chunk_the_kill_left_short_is_not_trusted(many: tuple[Path, Path], tmp_path: Path) -> None:
    mix, clean = many
    out = tmp_path / "out"
    stage = killed_mid_tokenizing(mix, out)
    rel = sorted(complete_chunks(stage))[0]
    # a machine that died after the chunk's rename reached the disk, not all of its tokens: the file is short
    tokens = stage / rel / "tokens.bin"
    os.truncate(tokens, tokens.stat().st_size // 2)
    source, key = rel.parts[1], rel.name

    r = weir_build(mix, out)
    assert r.returncode == 0, r.stderr
    assert f"warning: chunk {key} of source '{source}' was damaged" in r.stdout, r.stdout
    assert (out / rel / "tokens.bin").read_bytes() == (clean / rel / "tokens.bin").read_bytes()
    assert manifest(out) == manifest(clean)
    assert shards(out) == shards(clean)


def test_the_kept_work_with_more_tokens_wins_and_takes_the_others_chunks_never_a_temporary_one(
    tmp_path: Path,
) -> None:
    def chunk(folder: Path, key: str, size: int) -> Path:
        d = folder / "sources" / "qa" / "chunks" / key
        d.mkdir(parents=True)
        (d / "tokens.bin").write_bytes(b"t" * size)
        (d / "report.json").write_text("{}")
        return d

    dest = tmp_path / "out"
    cache, stage = work_cache(dest), tmp_path / ".out.building-4000001"
    chunk(cache, "k1", 100)
    chunk(cache, "k2", 100)
    (cache / "tokenizer").mkdir()
    (cache / "tokenizer" / "tokenizer.json").write_text('{"model": "cache"}')
    for key in ("k2", "k3", "k4"):
        chunk(stage, key, 100)
    chunk(stage, ".k5.4000001.tmp", 1000)  # complete but never renamed: the kill came before its rename
    (stage / "sources" / "qa" / "chunks" / ".k6.4000001.tmp").mkdir()
    (stage / "sources" / "qa" / "chunks" / ".k6.4000001.tmp" / "tokens.bin").write_bytes(b"short")
    (stage / "tokenizer").mkdir()
    (stage / "tokenizer" / "tokenizer.json").write_text('{"model": "sta')  # its tail never reached the disk
    (stage / "shards").mkdir()
    (stage / "shards" / "shard-00000.tokens.npy").write_bytes(b"x" * 10)
    inode = (stage / "sources" / "qa" / "chunks" / "k3" / "tokens.bin").stat().st_ino

    said: list[str] = []
    assert transaction._remove_leftovers(dest, said.append) == (0, 0, 4)
    assert said == [f"kept the tokenized work of a killed build in {cache} (4 chunks, 400 B)"]
    assert beside(dest) == {".out.cache"}
    got = sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file())
    assert got == [f"sources/qa/chunks/k{i}/{f}" for i in (1, 2, 3, 4) for f in ("report.json", "tokens.bin")]
    assert (cache / "sources" / "qa" / "chunks" / "k3" / "tokens.bin").stat().st_ino == inode, "moved, not copied"
    assert not (cache / "tokenizer").exists(), "a tokenizer cut short is trained again, never loaded"

    # a cache with more tokens than the killed build's stage stays, and takes the chunks it lacks
    stage = tmp_path / ".out.building-4000002"
    chunk(stage, "k9", 50)
    assert transaction._remove_leftovers(dest, said.append) == (1, 0, 5)
    assert said[-1] == f"kept the tokenized work of a killed build in {cache} (5 chunks, 450 B)"
    assert beside(dest) == {".out.cache"} and (cache / "sources" / "qa" / "chunks" / "k9" / "report.json").exists()

    # a killed build that tokenized nothing leaves nothing to keep: removed as before
    (tmp_path / ".out.building-4000003" / "sources").mkdir(parents=True)
    assert transaction._remove_leftovers(dest, said.append) == (1, 0, 0)
    assert len(said) == 2


def test_reuse_skips_what_killed_writers_left_and_gives_files_the_umask_mode(tmp_path: Path) -> None:
    prev, stage = tmp_path / "prev", tmp_path / "stage"
    chunks = prev / "sources" / "notes" / "chunks"
    for rel, mode in {
        "tokenizer/tokenizer.json": 0o644,
        "tokenizer/.tokenizer.json.1a2b3c4d.tmp": 0o644,  # atomic_path's file of a killed writer
        "sources/notes/chunks/k1/tokens.bin": 0o644,
        "sources/notes/chunks/k2/tokens.bin": 0o600,  # written by weir before files followed the umask
        "sources/notes/chunks/.k3.4242.tmp/tokens.bin": 0o644,  # a chunk folder a killed tokenizer left
    }.items():
        (prev / rel).parent.mkdir(parents=True, exist_ok=True)
        (prev / rel).write_text(rel)
        (prev / rel).chmod(mode)
    old = os.umask(0o022)
    try:
        n = reuse_previous(prev, stage)
    finally:
        os.umask(old)
    got = {str(p.relative_to(stage)): p for p in stage.rglob("*") if p.is_file()}
    assert sorted(got) == [
        "sources/notes/chunks/k1/tokens.bin",
        "sources/notes/chunks/k2/tokens.bin",
        "tokenizer/tokenizer.json",
    ]
    assert n == 3
    assert all(p.read_text() == rel and p.stat().st_mode & 0o777 == 0o644 for rel, p in got.items())
    assert got["sources/notes/chunks/k1/tokens.bin"].stat().st_ino == (chunks / "k1" / "tokens.bin").stat().st_ino
    assert (chunks / "k2" / "tokens.bin").stat().st_mode & 0o777 == 0o600, "the previous output is not changed"


def test_kept_work_is_the_cache_only_when_it_holds_tokenized_chunks(tmp_path: Path) -> None:
    dest = tmp_path / "out"
    cache = work_cache(dest)
    assert cache == tmp_path / ".out.cache"
    assert kept_work(dest) is None
    (cache / "sources" / "qa" / "chunks" / "k1").mkdir(parents=True)
    (cache / "tokenizer").mkdir()
    assert kept_work(dest) is None, "a chunk without its report is no tokenized chunk"
    (cache / "sources" / "qa" / "chunks" / "k1" / "report.json").write_text("{}")
    assert kept_work(dest) == cache


def test_seeding_from_several_folders_keeps_what_is_there_and_one_tokenizer(tmp_path: Path) -> None:
    def folder(name: str, files: dict[str, str]) -> Path:
        for rel, text in files.items():
            (tmp_path / name / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name / rel).write_text(text)
        return tmp_path / name

    newer = folder("cache", {"tokenizer/tokenizer.json": "newer", "sources/qa/chunks/k1/tokens.bin": "newer k1"})
    older = folder(
        "out",
        {
            "tokenizer/tokenizer.json": "older",
            "tokenizer/merges.txt": "older merges",  # a file of the other tokenizer: never mixed in
            "sources/qa/chunks/k1/tokens.bin": "older k1",
            "sources/qa/chunks/k2/tokens.bin": "older k2",
            "sources/qa/docs.parquet": "not reusable",
            "shards/shard-00000.tokens.npy": "not reusable",
        },
    )
    stage = tmp_path / "stage"
    assert reuse_previous(newer, stage) == 2
    assert reuse_previous(older, stage) == 1
    got = {str(p.relative_to(stage)): p.read_text() for p in stage.rglob("*") if p.is_file()}
    assert got == {
        "tokenizer/tokenizer.json": "newer",
        "sources/qa/chunks/k1/tokens.bin": "newer k1",
        "sources/qa/chunks/k2/tokens.bin": "older k2",
    }
