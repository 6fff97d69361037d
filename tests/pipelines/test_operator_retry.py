"""Fixing a mix costs seconds: a failed build keeps its tokenization (never as a partial output), ``weir plan``
plans from it, and the next build reuses it; ``weir plan`` trusts no folder whose documents differ from the mix."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from mixing import load_mix
from pipelines.transaction import build_output

ROOT = Path(__file__).resolve().parents[2]
WEIR = [sys.executable, "-m", "pipelines.cli"]


def weir(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WEIR, *map(str, args)], capture_output=True, text=True, cwd=ROOT)


def beside(out: Path) -> set[str]:
    return {p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}") or p.name == out.name}


def manifest(out: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((out / "shards" / "manifest.json").read_text())


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()
    }


def short_of(tiny_mix_path: Path) -> Path:
    """The tiny mix with an infeasible plan: qa may be read once, the plan needs 1.2 epochs of it."""
    short = tiny_mix_path.with_name("short.yaml")
    short.write_text(tiny_mix_path.read_text().replace("max_epochs: 50}", "max_epochs: 1}"))
    return short


@pytest.mark.slow
def test_a_failed_build_keeps_its_tokenization_and_the_fixed_mix_reuses_all_of_it(
    tiny_mix_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    r = weir("build", short_of(tiny_mix_path), "--out", out)
    assert r.returncode == 1 and "runs out" in r.stderr
    cache = out.with_name(".out.cache")
    assert f"kept the tokenized documents in {cache}" in " ".join(r.stderr.split())
    assert beside(out) == {".out.cache"}, "no partial output: the work is kept only in the hidden cache"
    assert not (cache / "shards").exists()
    chunks = {p.relative_to(cache): p.stat().st_ino for p in cache.glob("sources/*/chunks/*/*") if p.is_file()}
    assert {p.parts[1] for p in chunks} == {"notes", "qa"}

    # the plan of the fixed mix comes from the kept documents (nothing tokenized, nothing written)
    before = digests(cache)
    r = weir("plan", tiny_mix_path, "--build", out, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["build"] == str(cache)
    assert digests(cache) == before

    # the fixed mix builds from the kept chunks: every one reused as is (the same file), none tokenized again
    said: list[str] = []
    done = build_output(load_mix(tiny_mix_path), out, say=said.append)
    assert any(s.startswith(f"reusing the work a failed build kept in {cache}") for s in said), said
    assert done.reused_files >= len(chunks)
    for rel, inode in chunks.items():
        assert (out / rel).stat().st_ino == inode, rel
    assert beside(out) == {"out"}, "a successful build removes the cache"
    clean = build_output(load_mix(tiny_mix_path), tmp_path / "clean", say=lambda _s: None)
    assert isinstance(clean.dest, Path)  # a local build's folder
    assert manifest(out) == manifest(clean.dest)


@pytest.mark.slow
def test_a_damaged_chunk_in_the_kept_work_is_tokenized_again_and_weir_build_says_so(
    tiny_mix_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with pytest.raises(Exception, match="runs out"):
        build_output(load_mix(short_of(tiny_mix_path)), out, say=lambda _s: None)
    victim = sorted(out.with_name(".out.cache").glob("sources/notes/chunks/*/tokens.bin"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))

    r = weir("build", tiny_mix_path, "--out", out)
    assert r.returncode == 0, r.stderr
    assert f"warning: chunk {victim.parent.name} of source 'notes' was damaged" in r.stdout, r.stdout
    clean = build_output(load_mix(tiny_mix_path), tmp_path / "clean", fresh=True, say=lambda _s: None)
    assert isinstance(clean.dest, Path)  # a local build's folder
    assert manifest(out) == manifest(clean.dest)
    rebuilt = out / victim.relative_to(out.with_name(".out.cache"))  # the chunk the index points at
    assert rebuilt.read_bytes() == (clean.dest / rebuilt.relative_to(out)).read_bytes()


def test_plan_refuses_documents_of_another_mix_naming_what_differs(tiny_mix_path: Path, tmp_path: Path) -> None:
    build = tmp_path / "b"
    assert weir("plan", tiny_mix_path, "--build", build, "--compute").returncode == 0
    before = digests(build)
    text = tiny_mix_path.read_text()
    edits = {
        # another name, and a source that matches no file: the case of the issue
        "files: source 'notes': no file matches": text.replace("name: tiny", "name: other").replace(
            "/notes/*.txt", "/nothing/*.txt"
        ),
        "tokenizer: bos is True in the mix, False in": text.replace("{kind: bytes}", "{kind: bytes, bos: true}"),
        "rendering: source 'qa' makes other documents": text.replace(
            'template: "Q: {q} A: {a}"', 'template: "{q}={a}"'
        ),
        "sources: the mix has ['prose', 'qa']": text.replace("notes: {uri", "prose: {uri").replace(
            "notes: 0.", "prose: 0."
        ),
    }
    for expect, edited in edits.items():
        assert edited != text, expect
        mix = tmp_path / "edited.yaml"
        mix.write_text(edited)
        r = weir("plan", mix, "--build", build)
        msg = " ".join(r.stderr.split())
        assert r.returncode == 1, (expect, r.stdout)
        assert "stats do not fit the mix" in msg and expect in msg and "--compute" in msg, msg
    notes = sorted((tmp_path / "data" / "notes").glob("*.txt"))
    notes[3].write_text("Note 3, rewritten.\n")
    r = weir("plan", tiny_mix_path, "--build", build)
    assert r.returncode == 1
    assert "files: source 'notes' matches 12 files now" in r.stderr and "1 changed" in r.stderr, r.stderr
    assert digests(build) == before, "weir plan without --compute writes nothing"

    # --compute brings the stats up to date (only the changed file's chunk is tokenized), with progress
    r = weir("plan", tiny_mix_path, "--build", build, "--compute")
    assert r.returncode == 0, r.stderr
    assert "documents [notes]" in r.stdout and "tokenize notes" in r.stdout, r.stdout
    assert weir("plan", tiny_mix_path, "--build", build).returncode == 0


@pytest.mark.slow
def test_plan_compute_beside_a_finished_build_leaves_it_as_it_was(tiny_mix_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    build_output(load_mix(tiny_mix_path), out, say=lambda _s: None)
    before = digests(out)
    mix = tmp_path / "edited.yaml"
    mix.write_text(tiny_mix_path.read_text().replace('template: "Q: {q} A: {a}"', 'template: "{q}={a}"'))
    assert weir("plan", mix, "--build", out).returncode == 1

    r = weir("plan", mix, "--build", out, "--compute", "--json")
    assert r.returncode == 0, r.stderr
    cache = out.with_name(".out.cache")
    assert json.loads(r.stdout)["build"] == str(cache)
    assert digests(out) == before, "a finished build is never changed by weir plan"
    # the notes chunks came from the build (hard links): only qa, whose rendering changed, was tokenized
    for p in cache.glob("sources/notes/chunks/*/tokens.bin"):
        assert p.stat().st_ino == (out / p.relative_to(cache)).stat().st_ino
    assert weir("plan", mix, "--build", out).returncode == 0  # now from the cache, without --compute
