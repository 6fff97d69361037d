"""Tokenizers: a byte-level BPE trained on the mix's own sources (default), Hugging Face, tiktoken, bytes.

Every tokenizer appends its end-of-sequence id to each document (unless the mix says ``eos: false``),
prepends a BOS id when it says ``bos: true``, and has a ``fingerprint`` (sha256 of what determines its
output, BOS/EOS included), which is part of every downstream fingerprint (chunk keys, ``docs.parquet``'s
``tokenizer`` column, the shard manifest). ``encode_flat`` is the pipeline's fast path: one uint32 array
and the lengths, no per-document Python lists kept.

``pad_id`` fills the slots of a packed sequence after its last document. It is the tokenizer's own pad
token when it has one (a Hugging Face ``tokenizer.json``'s ``padding.pad_id``, else its special token named
"pad" in any dressing: ``<pad>``, ``[PAD]``, ``<|pad|>``, ``<｜▁pad▁｜>``), so that ``input_ids == pad_id``
never hits a document's EOS. A tokenizer without one (the trained BPE, ``bytes``, tiktoken's encodings) pads
with its EOS id: mask padding with ``labels == -100`` (the loader's labels) or ``num_tokens``, never by id.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from contract.atomic import atomic_path, write_json_atomic
from contract.errors import WeirError
from mixing.mixfile import envvars
from mixing.mixfile.mix import TokenizerSpec

__all__ = ["TextTokenizer", "TokenizerError", "load_tokenizer", "prepare_tokenizer", "train_bpe"]

EOS = "<|endoftext|>"


class TextTokenizer(Protocol):
    vocab_size: int
    eos_id: int
    fingerprint: str

    @property
    def pad_id(self) -> int:
        """The id that fills a packed sequence's slots after its last document (see the module's docstring)."""
        ...

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, BOS/EOS added as the spec says; deterministic."""
        ...

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, lengths)``: uint32 ids of all texts back to back (BOS/EOS included), int64 lengths."""
        ...

    def encode_start(self, texts: Sequence[str]) -> Any:
        """``encode_flat`` in two halves: this one does the tokenizer's GIL-free work ..."""
        ...

    def encode_finish(self, handle: Any) -> tuple[np.ndarray, np.ndarray]:
        """... and this one builds the arrays: ``encode_finish(encode_start(t)) == encode_flat(t)``."""
        ...


class _Bounded:
    """Adds the spec's BOS/EOS to a backend's raw ids; the fingerprint covers them.

    Subclasses set ``eos_id``, ``vocab_size``, ``_base_fp`` and implement ``_raw(texts)``.
    """

    eos_id: int
    bos_id: int | None = None
    add_eos: bool = True
    vocab_size: int
    _base_fp: str
    _pad: int | None = None  # the tokenizer's own pad token, if it has one

    @property
    def pad_id(self) -> int:
        """The id padding slots hold: the tokenizer's pad token, else its EOS id (see the module's docstring)."""
        return self.eos_id if self._pad is None else self._pad

    def _bounds(self, spec: TokenizerSpec, token_id: Callable[[str], int | None]) -> None:
        self.add_eos = spec.eos
        if spec.bos:
            name = spec.bos_token or spec.eos_token or EOS
            bos = token_id(name) if spec.bos_token else self.eos_id
            if bos is None:
                raise TokenizerError(f"tokenizer has no BOS token {name!r}; set tokenizer.bos_token to one it has")
            self.bos_id = bos
        pad = "" if self._pad is None else f"|pad={self._pad}"  # absent without a pad token: fingerprints as before
        self.fingerprint = _sha(
            f"{self._base_fp}|bos={self.bos_id}|eos={self.eos_id if spec.eos else None}{pad}".encode()
        )

    def _raw(self, texts: Sequence[str]) -> Iterable[list[int]]:
        raise NotImplementedError

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        head = [] if self.bos_id is None else [self.bos_id]
        tail = [self.eos_id] if self.add_eos else []
        return [[*head, *ids, *tail] for ids in self._raw(texts)]

    def encode_start(self, texts: Sequence[str]) -> Any:
        """The tokenizer's own work on ``texts`` (releases the GIL): run it on a worker thread while the
        caller turns the previous batch into arrays with :meth:`encode_finish`."""
        return self._start(list(texts))

    def encode_finish(self, handle: Any) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, lengths)`` of a batch started with :meth:`encode_start`, as :meth:`encode_flat`."""
        return self._finish(handle)

    def encode_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        return self._finish(self._start(list(texts)))

    def _start(self, texts: list[str]) -> Any:
        return list(self._raw(texts))

    def _finish(self, handle: Any) -> tuple[np.ndarray, np.ndarray]:
        return self._flatten(handle)

    def _flatten(self, id_lists: Iterable[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        out: list[int] = []
        lengths: list[int] = []
        extra = (self.bos_id is not None) + self.add_eos
        for ids in id_lists:
            if self.bos_id is not None:
                out.append(self.bos_id)
            out.extend(ids)
            if self.add_eos:
                out.append(self.eos_id)
            lengths.append(len(ids) + extra)
        return np.array(out, dtype="<u4"), np.array(lengths, dtype=np.int64)

    def _join(self, arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        extra = (self.bos_id is not None) + self.add_eos
        lengths = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays)) + extra
        bos = np.array([self.bos_id or 0], dtype="<u4")
        eos = np.array([self.eos_id], dtype="<u4")
        parts: list[np.ndarray] = []
        for a in arrays:
            if self.bos_id is not None:
                parts.append(bos)
            parts.append(a)
            if self.add_eos:
                parts.append(eos)
        return (np.concatenate(parts).astype("<u4", copy=False) if parts else np.zeros(0, "<u4")), lengths


class TokenizerError(WeirError, ValueError):
    """A tokenizer that cannot be loaded as the mix file describes (file, encoding or special token)."""


class _HFTokenizer(_Bounded):
    def __init__(self, path: Path, spec: TokenizerSpec) -> None:
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on a bad file
            raise TokenizerError(f"{path}: not a Hugging Face tokenizer.json: {e}") from None
        eos_token = spec.eos_token or EOS
        eos = self._tok.token_to_id(eos_token)
        if eos is None:
            raise TokenizerError(f"{path}: no token {eos_token!r} to end documents with; set tokenizer.eos_token")
        self.eos_id = eos
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        data = path.read_bytes()
        self._base_fp = _sha(data)
        self._pad = _pad_token(json.loads(data), eos)
        self._bounds(spec, self._tok.token_to_id)

    def _raw(self, texts: Sequence[str]) -> Iterable[list[int]]:
        return (e.ids for e in self._start(list(texts)))

    def _start(self, texts: list[str]) -> Any:
        # encode_batch_fast skips offsets; it releases the GIL and uses RAYON_NUM_THREADS threads.
        return self._tok.encode_batch_fast(texts, add_special_tokens=False)

    def _finish(self, handle: Any) -> tuple[np.ndarray, np.ndarray]:
        return self._flatten(e.ids for e in handle)


class _TiktokenTokenizer(_Bounded):
    def __init__(self, spec: TokenizerSpec) -> None:
        import tiktoken

        assert spec.name is not None
        try:
            self._enc = tiktoken.get_encoding(spec.name)
        except Exception as e:  # unknown name, or no network and nothing in TIKTOKEN_CACHE_DIR
            raise TokenizerError(
                f"tiktoken encoding {spec.name!r} cannot be loaded ({type(e).__name__}: {e}); offline, set "
                "TIKTOKEN_CACHE_DIR to a folder holding tiktoken's cache files"
            ) from None
        self._pool: ThreadPoolExecutor | None = None
        self.eos_id = self._enc.eot_token
        self.vocab_size = self._enc.n_vocab
        self._base_fp = _sha(f"tiktoken|{spec.name}|{self._enc.n_vocab}".encode())

        def token_id(name: str) -> int | None:
            return self._enc._special_tokens.get(name)  # type: ignore[attr-defined]

        self._bounds(spec, token_id)

    def _raw(self, texts: Sequence[str]) -> Iterable[list[int]]:
        return self._enc.encode_ordinary_batch(list(texts), num_threads=_threads())

    def _start(self, texts: list[str]) -> Any:
        return self._arrays(texts)

    def _finish(self, handle: Any) -> tuple[np.ndarray, np.ndarray]:
        return self._join(handle)

    def _arrays(self, texts: Sequence[str]) -> list[np.ndarray]:
        # encode_to_numpy with no special tokens is encode_ordinary straight into a uint32 buffer; it
        # releases the GIL, so a pool of RAYON_NUM_THREADS threads parallelizes it like the batch call.
        def one(t: str) -> np.ndarray:
            return self._enc.encode_to_numpy(t, allowed_special=set(), disallowed_special=())

        threads = _threads()
        if threads <= 1 or len(texts) <= 1:
            return [one(t) for t in texts]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="weir-tiktoken")
        return list(self._pool.map(one, texts))


class _BytesTokenizer(_Bounded):
    def __init__(self, spec: TokenizerSpec) -> None:
        self.vocab_size, self.eos_id = 257, 256
        self._base_fp = _sha(b"bytes-v1")
        self._bounds(spec, lambda name: 256 if name == EOS else None)

    def _raw(self, texts: Sequence[str]) -> Iterable[list[int]]:
        return (list(t.encode("utf-8")) for t in texts)


def _pad_token(config: dict[str, Any], eos: int) -> int | None:
    """The pad id of a ``tokenizer.json`` (parsed): its ``padding.pad_id``, else the first special added token
    whose name, without brackets, bars and "▁", is "pad"; None when it has neither or it is the EOS."""
    padding = config.get("padding")
    found = padding.get("pad_id") if isinstance(padding, dict) else None
    if not isinstance(found, int):
        for tok in config.get("added_tokens") or []:
            if tok.get("special") and re.sub(r"[\W_▁]", "", str(tok.get("content", ""))).lower() == "pad":
                found = int(tok["id"])
                break
    return found if isinstance(found, int) and found != eos else None


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

    ``sample`` is only consumed for ``bpe``: the trained BPE is a function of the spec and the sample's
    text, so when ``out_dir`` already holds one trained on the same sample (``sample.sha256``) it is kept
    as is (an incremental rebuild whose changes are all outside the sample keeps its tokenizer, and so
    every downstream fingerprint). Writes ``out_dir/tokenizer.json`` (bpe, hf) and ``out_dir/spec.json``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    if spec.kind == "bpe":
        texts = list(sample)
        h = hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode())
        for t in texts:
            h.update(t.encode("utf-8", "surrogatepass") + b"\0")
        key = h.hexdigest()
        stamp = out_dir / "sample.sha256"
        if not ((out_dir / "tokenizer.json").exists() and stamp.exists() and stamp.read_text() == key):
            train_bpe(texts, spec.vocab_size, out_dir / "tokenizer.json")
            with atomic_path(stamp) as tmp:
                tmp.write_text(key)
    elif spec.kind == "hf":
        assert spec.path is not None
        src = Path(os.path.expanduser(envvars.expand(spec.path)))  # {env_NAME} is kept in the spec, never shown
        try:
            data = src.read_bytes()
        except OSError as e:
            raise TokenizerError(f"tokenizer.path {spec.path!r}: cannot read it: {e}") from None
        with atomic_path(out_dir / "tokenizer.json") as tmp:
            tmp.write_bytes(data)
    write_json_atomic(out_dir / "spec.json", spec.model_dump(mode="json"))
    return load_tokenizer(spec, out_dir)


def load_tokenizer(spec: TokenizerSpec, out_dir: Path) -> TextTokenizer:
    """Load the tokenizer prepared in ``out_dir`` by :func:`prepare_tokenizer`."""
    if spec.kind in ("bpe", "hf"):
        return _HFTokenizer(out_dir / "tokenizer.json", spec)
    if spec.kind == "tiktoken":
        return _TiktokenTokenizer(spec)
    return _BytesTokenizer(spec)
