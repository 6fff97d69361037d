"""Tokenizers: a byte-level BPE trained on the mix's own sources (default), Hugging Face, tiktoken, bytes.

Every tokenizer appends its end-of-sequence id to each document and has a ``fingerprint`` (sha256 of
what determines its output), which is part of every downstream fingerprint.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from mixing.layout import atomic_path, write_json_atomic
from mixing.mixfile import TokenizerSpec

__all__ = ["TextTokenizer", "load_tokenizer", "prepare_tokenizer"]

EOS = "<|endoftext|>"


class TextTokenizer(Protocol):
    vocab_size: int
    eos_id: int
    fingerprint: str

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, EOS appended; deterministic."""
        ...


@dataclass(frozen=True)
class _HFTokenizer:
    path: Path
    eos_token: str

    def __post_init__(self) -> None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self.path))
        eos = tok.token_to_id(self.eos_token)
        if eos is None:
            raise ValueError(f"{self.path}: no token {self.eos_token!r} to end documents with")
        object.__setattr__(self, "_tok", tok)
        object.__setattr__(self, "eos_id", eos)
        object.__setattr__(self, "vocab_size", tok.get_vocab_size(with_added_tokens=True))
        object.__setattr__(self, "fingerprint", _sha(self.path.read_bytes()))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encs = self._tok.encode_batch_fast(list(texts), add_special_tokens=False)  # type: ignore[attr-defined]
        return [[*e.ids, self.eos_id] for e in encs]  # type: ignore[attr-defined]


@dataclass(frozen=True)
class _TiktokenTokenizer:
    name: str

    def __post_init__(self) -> None:
        import tiktoken

        enc = tiktoken.get_encoding(self.name)
        object.__setattr__(self, "_enc", enc)
        object.__setattr__(self, "eos_id", enc.eot_token)
        object.__setattr__(self, "vocab_size", enc.n_vocab)
        object.__setattr__(self, "fingerprint", _sha(f"tiktoken|{self.name}|{enc.n_vocab}".encode()))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        ids = self._enc.encode_ordinary_batch(list(texts), num_threads=_threads())  # type: ignore[attr-defined]
        return [[*x, self.eos_id] for x in ids]


class _BytesTokenizer:
    vocab_size = 257
    eos_id = 256
    fingerprint = _fp = hashlib.sha256(b"bytes-v1").hexdigest()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [[*t.encode("utf-8"), 256] for t in texts]


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _threads() -> int:
    return int(os.environ.get("RAYON_NUM_THREADS") or os.cpu_count() or 1)


def train_bpe(texts: Iterable[str], vocab_size: int, out: Path) -> Path:
    """Train a byte-level BPE with ``EOS`` as its only special token; write ``tokenizer.json`` atomically."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[assignment]
    tok.decoder = decoders.ByteLevel()  # type: ignore[assignment]
    trainer = trainers.BpeTrainer(  # type: ignore[call-arg]
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    with atomic_path(out) as tmp:
        tok.save(str(tmp))
    return out


def prepare_tokenizer(spec: TokenizerSpec, out_dir: Path, sample: Iterable[str]) -> TextTokenizer:
    """Make the tokenizer ``spec`` describes usable from ``out_dir`` (training it if ``kind: bpe``).

    ``sample`` is only consumed for ``bpe``. Writes ``out_dir/tokenizer.json`` (bpe, hf) and
    ``out_dir/spec.json``; returns the loaded tokenizer.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if spec.kind == "bpe":
        train_bpe(sample, spec.vocab_size, out_dir / "tokenizer.json")
    elif spec.kind == "hf":
        assert spec.path is not None
        src = Path(os.path.expanduser(spec.path))
        with atomic_path(out_dir / "tokenizer.json") as tmp:
            tmp.write_bytes(src.read_bytes())
    write_json_atomic(out_dir / "spec.json", spec.model_dump(mode="json"))
    return load_tokenizer(spec, out_dir)


def load_tokenizer(spec: TokenizerSpec, out_dir: Path) -> TextTokenizer:
    """Load the tokenizer prepared in ``out_dir`` by :func:`prepare_tokenizer`."""
    if spec.kind in ("bpe", "hf"):
        return _HFTokenizer(out_dir / "tokenizer.json", spec.eos_token or EOS)  # type: ignore[return-value]
    if spec.kind == "tiktoken":
        assert spec.name is not None
        return _TiktokenTokenizer(spec.name)  # type: ignore[return-value]
    return _BytesTokenizer()
