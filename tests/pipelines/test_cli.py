"""The ``weir`` CLI end to end on the demo mix, checked against an independent count."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from contract.shards import ShardSet
from mixing import load_mix
from tests.conftest import TINY_MIX, write_tiny_sources

ROOT = Path(__file__).resolve().parents[2]
WEIR = [sys.executable, "-m", "pipelines.cli"]


def weir(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WEIR, *args], capture_output=True, text=True, cwd=ROOT)


def independent_documents(mix_path: Path, build: Path) -> dict[str, list[list[int]]]:
    """Tokenize every source again, without weir's readers: files sorted, records in order, bad ones skipped."""
    mix = load_mix(mix_path)
    tok = Tokenizer.from_file(str(build / "tokenizer" / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    out: dict[str, list[list[int]]] = {}
    for name, spec in mix.sources.items():
        pattern = mix.source_uri(name)
        texts = []
        for f in sorted(Path("/").glob(pattern.lstrip("/"))):
            if spec.format == "text":
                texts.append(f.read_text())
                continue
            for line in f.read_text().splitlines():
                try:
                    texts.append(spec.template.format(**json.loads(line)))  # type: ignore[union-attr]
                except (ValueError, KeyError):
                    continue
        out[name] = [[*e.ids, eos] for e in tok.encode_batch(texts, add_special_tokens=False)]
    return out


def test_build_and_inspect_match_an_independent_count(demo_build: Path) -> None:
    r = weir("inspect", str(demo_build), "--json")
    assert r.returncode == 0, r.stderr
    report = json.loads(r.stdout)
    mix_path = demo_build.parent / "demo.yaml"
    mix = load_mix(mix_path)
    docs = independent_documents(mix_path, demo_build)

    assert report["steps"] == mix.total_steps
    assert report["sequences"] == mix.total_steps * mix.sequence.global_batch
    assert report["truncated_docs"] == 0
    assert report["corrupt_files"] == []
    assert report["packing_efficiency"] > 0.99
    total = 0
    for name, s in report["per_source"].items():
        assert s["documents_indexed"] == len(docs[name]), name
        assert s["tokens_indexed"] == sum(map(len, docs[name])), name
        assert s["tokens_planned"] == s["tokens_packed"] + s["tokens_dropped"], name
        total += s["tokens_packed"]
    assert total == report["tokens"]

    # every packed segment is exactly the independently tokenized document slice it claims to be
    shards = ShardSet(demo_build / "shards")
    sources = shards.manifest.sources
    for i in range(len(shards)):
        view = shards.sequence(i)
        pos = 0
        for src, doc, start, length in view.segments.tolist():
            expect = docs[sources[src]][doc][start : start + length]
            assert np.array_equal(view.tokens[pos : pos + length], expect), (i, src, doc)
            pos += length


def test_inspect_names_a_corrupted_shard(demo_build: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(demo_build, copy)
    victim = sorted((copy / "shards").glob("*.tokens.npy"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01
    victim.write_bytes(bytes(data))
    r = weir("inspect", str(copy))
    assert r.returncode == 1
    assert victim.name in r.stderr


@pytest.mark.parametrize(
    ("edit", "expect"),
    [
        (
            ("mixture: {prose: 0.7, code: 0.2, qa: 0.1}", "mixture: {prose: 0.7, code: 0.2, web: 0.1}"),
            "unknown source 'web'",
        ),
        (
            ("mixture: {prose: 0.7, code: 0.2, qa: 0.1}", "mixture: {prose: 0.7, code: 0.2, qa: 0.2}"),
            "sum to 1",
        ),
        (("steps: 8,", "steps: -8,"), "greater than 0"),
        (("sequence: {length: 2048, global_batch: 16}", ""), "sequence: field required"),
        (("name: demo", "name: [demo"), "YAML syntax error"),
    ],
)
def test_invalid_mix_fails_build_without_output(tmp_path: Path, edit: tuple[str, str], expect: str) -> None:
    text = (ROOT / "mixes" / "demo.yaml").read_text()
    assert edit[0] in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace(*edit))
    out = tmp_path / "out"
    r = weir("build", str(bad), "--out", str(out))
    assert r.returncode == 2
    msg = " ".join(r.stderr.split())
    assert f"{bad}:" in msg and expect in msg, msg
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [bad]
    assert weir("validate", str(bad)).returncode == 2


def test_failed_build_keeps_no_partial_output(tiny_mix_path: Path, tmp_path: Path) -> None:
    text = tiny_mix_path.read_text().replace("max_epochs: 50}", "max_epochs: 1}")
    bad = tmp_path / "short.yaml"
    bad.write_text(text)
    out = tmp_path / "out"
    r = weir("build", str(bad), "--out", str(out))
    assert r.returncode == 1
    assert "runs out" in r.stderr
    assert not out.exists()
    # only the hidden work cache is left (its tokenized documents, no shards), for the next build to reuse
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")] == [".out.cache"]
    assert not (tmp_path / ".out.cache" / "shards").exists()


def test_build_prints_every_warning_weir_plan_prints_in_the_same_words(tiny_mix_path: Path, tmp_path: Path) -> None:
    """qa without max_epochs is drawn more than once: ``weir plan`` warns about it, and so does the build."""
    text = tiny_mix_path.read_text()
    assert 'A: {a}", max_epochs: 50}' in text
    mix = tmp_path / "uncapped.yaml"
    mix.write_text(text.replace('A: {a}", max_epochs: 50}', 'A: {a}"}'))
    out = tmp_path / "out"
    built = weir("build", str(mix), "--out", str(out))
    assert built.returncode == 0, built.stderr
    planned = weir("plan", str(mix), "--build", str(out))
    assert planned.returncode == 0, planned.stderr
    warnings = [line for line in planned.stdout.splitlines() if line.startswith("warning: ")]
    repeated = r"warning: source 'qa' is repeated \d\.\d\d times \(no max_epochs caps it\)"
    assert any(re.fullmatch(repeated, w) for w in warnings), planned.stdout
    said = [line.strip() for line in built.stdout.splitlines()]
    for w in warnings:
        assert w in said, (w, built.stdout)


# --- weir validate: the everyday mistakes, in seconds, one line each (exit 2) ----------------------------


def tiny_mix(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """The tiny mix in ``tmp_path/cfg``, its sources and an hf tokenizer file given relative to that folder."""
    cfg = tmp_path / "cfg"
    write_tiny_sources(cfg / "data")
    (cfg / "tok").mkdir()
    (cfg / "tok" / "tokenizer.json").write_text("{}")  # validate checks that it is readable, not what it holds
    text = TINY_MIX.format(root="data").replace(
        "{kind: bytes}", '{kind: hf, path: tok/tokenizer.json, eos_token: "</s>"}'
    )
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    (cfg / "tiny.yaml").write_text(text)
    return cfg / "tiny.yaml"


def weir_in(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*WEIR, *args], capture_output=True, text=True, cwd=cwd, env=env)


def test_validate_a_valid_mix_prints_its_one_line_from_any_current_directory(tmp_path: Path) -> None:
    mix = tiny_mix(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    r = weir_in(tmp_path / "elsewhere", "validate", str(mix))  # tokenizer.path and the uris: from the mix's folder
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert r.stdout == f"{mix}: ok — mix 'tiny', 2 sources, 2 phases, 8 steps of 4×64 tokens\n"


@pytest.mark.parametrize(
    ("edit", "line", "words"),
    [
        (("notes/*.txt", "notes/*.md"), 6, "sources.notes.uri: no file matches '{cfg}/data/notes/*.md'"),
        (("tok/tokenizer.json", "tok/tokenizer.jsn"), 3, "tokenizer.path: no such file '{cfg}/tok/tokenizer.jsn'"),
        (
            ("data/qa.jsonl", "{{mix_dir}}/data/qa.jsonl"),
            7,
            "sources.qa.uri: expanding it leaves the placeholder {mix_dir}",
        ),
        (
            ("data/notes", "{env_WEIR_TEST_UNSET}/notes"),
            6,
            "sources.notes.uri: environment variable WEIR_TEST_UNSET is not set",
        ),
        (
            ("max_epochs: 50", "max_epoch: 50"),
            6,
            "sources.notes.max_epoch: unknown field 'max_epoch'; did you mean 'max_epochs'?",
        ),
    ],
)
def test_validate_names_each_mistake_in_one_line(tmp_path: Path, edit: tuple[str, str], line: int, words: str) -> None:
    mix = tiny_mix(tmp_path, edit)
    r = weir_in(tmp_path, "validate", str(mix), env={k: v for k, v in os.environ.items() if k != "WEIR_TEST_UNSET"})
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.count("\n") == 1, r.stderr
    words = words.replace("{cfg}", str(mix.parent))
    assert r.stderr.startswith(f"invalid mix file: {mix}:{line}: {words}"), r.stderr


def test_validate_notes_an_s3_source_it_cannot_list(tmp_path: Path) -> None:
    mix = tiny_mix(tmp_path, ("data/qa.jsonl", "s3://corpus/qa.jsonl"))
    r = weir_in(tmp_path, "validate", str(mix), env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")})
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{mix}: ok — mix 'tiny', 2 sources, 2 phases, 8 steps of 4×64 tokens\n"
    assert r.stderr.startswith(f"note: {mix}:7: sources.qa.uri: not checked: 's3://corpus/qa.jsonl' is in object"), (
        r.stderr
    )
    assert r.stderr.count("\n") == 1, r.stderr


@pytest.mark.parametrize("command", ["build", "plan"])
def test_build_and_plan_refuse_a_missing_tokenizer_before_any_work(tmp_path: Path, command: str) -> None:
    mix = tiny_mix(tmp_path, ("tok/tokenizer.json", "tok/absent.json"))
    out = tmp_path / "out"
    r = weir_in(tmp_path, command, str(mix), "--out" if command == "build" else "--build", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == (
        f"invalid mix file: {mix}:3: tokenizer.path: no such file '{mix.parent}/tok/absent.json'; expected a "
        "tokenizer.json (a relative path starts at the mix file's folder)\n"
    )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cfg"]


def test_build_continuation_flags_are_checked_in_one_line_before_building(tiny_mix_path: Path, tmp_path: Path) -> None:
    """--continue without --at, --feedback without a continuation, an --at past the run: exit 2, one line, nothing
    built. (Continuations themselves: tests/mixing/test_continuation.py.)"""
    log = tmp_path / "losses.csv"
    log.write_text("step,source,loss_sum,tokens\n0,notes,1.0,10\n")
    out = tmp_path / "out"
    for flags, said in (
        (["--continue", str(tmp_path)], "--continue and --at go together"),
        (["--feedback", str(log)], "--feedback reweights a continuation"),
        (["--continue", str(tmp_path), "--at", "99"], "step 99 is not before the run's end"),
    ):
        r = weir("build", str(tiny_mix_path), "--out", str(out), *flags)
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert not out.exists()
