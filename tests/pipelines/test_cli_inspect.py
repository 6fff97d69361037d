"""``pipelines/cli_inspect.py``: ``weir inspect`` on the demo build, checked against an independent count, and
naming a corrupted shard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from contract.shards import ShardSet
from mixing import load_mix
from tests.pipelines.cli_helpers import ROOT, weir


def independent_documents(mix_path: Path, build: Path) -> dict[str, list[list[int]]]:
    """Tokenize every source again, without weir's readers: files sorted, records in order, bad ones skipped."""
    mix = load_mix(mix_path)
    tok = Tokenizer.from_file(str(build / "tokenizer" / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    assert eos is not None
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
    assert sources is not None
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


@pytest.mark.parametrize("command", ["inspect", "lookup", "epochs", "plan", "validate"])
def test_read_only_commands_load_no_dagster(demo_build: Path, command: str) -> None:
    """``weir inspect``, ``lookup``, ``epochs``, ``plan`` and ``validate`` read a build's files or a mix: the UI's
    framework (and its plotting) is not imported, so they start in about a second, not three."""
    mix = str(demo_build.parent / "demo.yaml")
    args = {
        "inspect": [str(demo_build)],
        "lookup": [str(demo_build), "--step", "1"],
        "epochs": [str(demo_build)],
        "plan": [mix, "--build", str(demo_build)],
        "validate": [mix],
    }[command]
    code = (
        "import sys\n"
        f"sys.argv = ['weir', {command!r}, *{args!r}]\n"
        "from pipelines.cli import app\n"  # the command's app itself: the entry point would end the process
        "try:\n    app()\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print('LOADED', ' '.join(sorted(m for m in sys.modules if '.' not in m)))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    loaded = set(r.stdout.rsplit("LOADED", 1)[1].split())
    assert "mixing" in loaded and not loaded & {"dagster", "matplotlib", "ray", "torch"}, sorted(loaded)
