"""Deterministic synthetic corpora for the embedded demo (no network, no downloaded data).

``write_demo_data(root)`` writes ``root/prose/doc-XXXXX.txt`` (prose-like documents with a long-tailed,
Pareto length distribution: most short, a few longer than a demo sequence) and ``root/qa/qa-X.jsonl``
(question/answer records; a few deliberately malformed lines show quarantine at work).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from contract.atomic import atomic_path

__all__ = ["write_demo_data"]

_SYLLABLES = [
    "ka",
    "lo",
    "mi",
    "ra",
    "te",
    "su",
    "na",
    "vi",
    "do",
    "pe",
    "ri",
    "an",
    "el",
    "or",
    "um",
    "is",
    "th",
    "er",
    "on",
    "al",
    "en",
    "ar",
    "ou",
    "st",
    "ch",
]


def _lexicon(rng: np.random.Generator, n: int) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        k = int(rng.integers(1, 5))
        words.add("".join(rng.choice(_SYLLABLES, size=k)))
    return sorted(words)


def _sentence(rng: np.random.Generator, lex: list[str], zipf: np.ndarray) -> str:
    n = int(rng.integers(5, 18))
    words = [lex[i] for i in rng.choice(len(lex), size=n, p=zipf)]
    return " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!"])


def write_demo_data(root: Path, seed: int = 7, prose_docs: int = 1500, qa_records: int = 3000) -> dict[str, int]:
    """Write the demo corpora under ``root`` (idempotent for the same arguments); return file counts."""
    rng = np.random.default_rng(seed)
    lex = _lexicon(rng, 12000)
    zipf = 1.0 / np.arange(1, len(lex) + 1) ** 1.1
    zipf /= zipf.sum()
    prose = root / "prose"
    prose.mkdir(parents=True, exist_ok=True)
    # Pareto(1.3) sentence counts: median ~ 7 sentences, a tail of documents thousands of sentences long.
    lengths = np.minimum((5 * (1 + rng.pareto(1.3, size=prose_docs))).astype(int), 4000)
    for i, n_sent in enumerate(lengths):
        paras = []
        for _ in range(0, int(n_sent), 6):
            paras.append(" ".join(_sentence(rng, lex, zipf) for _ in range(6)))
        with atomic_path(prose / f"doc-{i:05d}.txt") as tmp:
            tmp.write_text("\n\n".join(paras) + "\n")
    qa = root / "qa"
    qa.mkdir(parents=True, exist_ok=True)
    per_file = qa_records // 3
    for f in range(3):
        lines = []
        for r in range(per_file):
            a, b = (int(x) for x in rng.integers(2, 999, size=2))
            q = f"{_sentence(rng, lex, zipf)} What is {a} times {b}?"
            ans = f"{_sentence(rng, lex, zipf)} {a} times {b} is {a * b}."
            lines.append(json.dumps({"id": f"{f}-{r}", "question": q, "answer": ans}))
        lines.insert(per_file // 2, '{"id": "broken", "question": "unterminated')
        lines.insert(per_file // 3, json.dumps({"id": "no-answer", "question": "What is missing?"}))
        with atomic_path(qa / f"qa-{f}.jsonl") as tmp:
            tmp.write_text("\n".join(lines) + "\n")
    return {"prose_files": prose_docs, "qa_files": 3}
