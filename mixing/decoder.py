"""The decoder of a build's tokenizer: lists of token ids back to text, as ``weir lookup --text`` shows them.

A build keeps its tokenizer in ``tokenizer/``: ``spec.json`` (its ``kind``: ``bytes``, ``bpe``, ``hf`` or
``tiktoken``, and for tiktoken the encoding's ``name``) and, for ``bpe`` and ``hf``, ``tokenizer.json``.
:func:`load_decoder` turns that spec into a :data:`Decode`: ids 0..255 of ``bytes`` are the bytes (256, the
EOS, is dropped); the others decode with their library, special tokens kept. Bytes that are no whole character
(a piece that cuts a character's bytes) decode to U+FFFD. Deterministic: the same ids give the same text.
``tokenizers`` and ``tiktoken`` are imported only when their kind is loaded.

A tokenizer that cannot be loaded is a :class:`DecoderError` of one line that names the file or encoding and
what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from contract.errors import WeirError, first_line

__all__ = ["Decode", "DecoderError", "load_decoder"]

Decode = Callable[[list[list[int]]], list[str]]
"""Lists of token ids → their texts, one per list, in order."""


class DecoderError(WeirError, ValueError):
    """A tokenizer that cannot be loaded for decoding; the message says which and what to do."""


def load_decoder(spec: dict[str, Any], folder: Path) -> Decode:
    """Lists of token ids → their texts, for the tokenizer ``spec`` (``tokenizer/spec.json``) prepared in
    ``folder``; bytes that are no whole character decode to U+FFFD."""
    kind = spec.get("kind")
    if kind == "bytes":  # ids 0..255 are the bytes; 256 is the EOS
        return lambda batch: [bytes(i for i in ids if i < 256).decode("utf-8", "replace") for ids in batch]
    if kind in ("bpe", "hf"):
        from tokenizers import Tokenizer

        path = folder / "tokenizer.json"
        try:
            tok = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception on a missing or bad file
            raise DecoderError(
                f"{path}: cannot load it ({first_line(e)}); build the mix again to restore the tokenizer"
            ) from None
        return lambda batch: tok.decode_batch(batch, skip_special_tokens=False)
    if kind == "tiktoken":
        import tiktoken

        try:
            enc = tiktoken.get_encoding(str(spec.get("name")))
        except Exception as e:  # unknown name, or offline without TIKTOKEN_CACHE_DIR
            raise DecoderError(
                f"tiktoken encoding {spec.get('name')!r} cannot be loaded ({first_line(e)}); offline, set "
                "TIKTOKEN_CACHE_DIR to a folder holding tiktoken's cache files"
            ) from None
        return lambda batch: [enc.decode(ids, errors="replace") for ids in batch]
    raise DecoderError(f"{folder}/spec.json: unknown tokenizer kind {kind!r}; build the mix again with this weir")
