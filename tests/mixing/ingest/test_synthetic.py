"""mixing/ingest/synthetic.py: the demo's corpora are a function of the seed (written again, byte for byte the
same; another seed, other documents), the counts it returns are the files it wrote, the prose is long-tailed
(most documents short, a few longer than a demo sequence), and the qa records are what the demo mix's own
template renders, with exactly the malformed lines that show quarantine at work (one unparsable line and one
record lacking ``answer`` per file: the README's "3 of 3006 records lack template field 'answer'")."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mixing import load_mix
from mixing.ingest.sources import read_records
from mixing.ingest.synthetic import write_demo_data
from mixing.mixfile.mix import Mix

ROOT = Path(__file__).resolve().parents[3]
PROSE, QA = 100, 150  # smaller than the demo's 1500 and 3000: the same generator (the same first documents)


@pytest.fixture(scope="module")
def demo_mix() -> Mix:
    return load_mix(ROOT / "mixes" / "demo.yaml")


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    root = tmp_path_factory.mktemp("demo-data")
    return root, write_demo_data(root, prose_docs=PROSE, qa_records=QA)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_corpora_are_a_function_of_the_seed(corpora: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    root, counts = corpora
    before = tree(root)
    assert write_demo_data(root, prose_docs=PROSE, qa_records=QA) == counts  # written again over itself
    assert tree(root) == before  # byte for byte, and nothing left beside the files (no temporary file)
    other = write_demo_data(tmp_path, seed=8, prose_docs=20, qa_records=30)
    assert other == {"prose_files": 20, "qa_files": 3}
    prose = {b for name, b in before.items() if name.startswith("prose/")}
    assert not prose & {b for name, b in tree(tmp_path).items() if name.startswith("prose/")}


def test_the_counts_are_the_files_written(corpora: tuple[Path, dict[str, int]]) -> None:
    root, counts = corpora
    assert counts == {"prose_files": PROSE, "qa_files": 3}
    assert sorted(p.name for p in (root / "prose").iterdir()) == [f"doc-{i:05d}.txt" for i in range(PROSE)]
    assert sorted(p.name for p in (root / "qa").iterdir()) == [f"qa-{f}.jsonl" for f in range(3)]
    assert sorted(p.name for p in root.iterdir()) == ["prose", "qa"]


def test_the_prose_is_long_tailed_around_the_demo_sequence(corpora: tuple[Path, dict[str, int]], demo_mix: Mix) -> None:
    """The demo's byte-level BPE splits words apart, so a document of n words has at least n tokens; and no token
    is shorter than a byte, so a document of n bytes has at most n + 1 (its EOS)."""
    root, _counts = corpora
    spec = demo_mix.sources["prose"]
    texts = []
    for path in sorted((root / "prose").iterdir()):
        (rec,) = read_records(str(path), spec)  # one document a file, read as the demo mix reads it
        assert rec.error is None and rec.text
        texts.append(rec.text)
    words = np.array([len(t.split()) for t in texts])
    nbytes = np.array([len(t.encode()) for t in texts])
    warmup = demo_mix.curriculum[0].max_doc_tokens
    assert warmup is not None
    assert np.mean(nbytes + 1 <= warmup) > 0.5  # most documents are short enough for the short-docs warmup
    assert 1 <= np.sum(words > demo_mix.sequence.length) <= 0.05 * len(texts)  # a few longer than a sequence
    assert words.max() > 10 * np.median(words)  # a long tail, not a spread around a mean


def test_the_qa_records_are_what_the_demo_template_renders_and_a_few_are_malformed(
    corpora: tuple[Path, dict[str, int]], demo_mix: Mix
) -> None:
    root, _counts = corpora
    spec = demo_mix.sources["qa"]
    shape = re.compile(r"Q: .+ What is (\d+) times (\d+)\?\nA: .+ (\d+) times (\d+) is (\d+)\.", re.S)
    for f in range(3):
        records = list(read_records(str(root / "qa" / f"qa-{f}.jsonl"), spec))
        assert len(records) == QA // 3 + 2
        assert Counter(r.reason for r in records) == {None: QA // 3, "invalid JSON": 1, "missing field": 1}
        (missing,) = [r for r in records if r.reason == "missing field"]
        assert missing.error == "missing field: template field 'answer' is missing"
        for r in records:
            if r.text is None:
                continue
            m = shape.fullmatch(r.text)
            assert m is not None, r.text
            a, b, a2, b2, product = (int(x) for x in m.groups())
            assert (a, b) == (a2, b2) and product == a * b and 2 <= a < 999 and 2 <= b < 999
