"""``mixing.decoder``: a build's tokenizer spec as a decoder of token ids back to text."""

from __future__ import annotations

from pathlib import Path

import pytest

from mixing.decoder import DecoderError, load_decoder


def test_a_bytes_tokenizer_decodes_whole_characters_and_drops_its_eos() -> None:
    decode = load_decoder({"kind": "bytes"}, Path("unused"))
    assert decode([[*"héllo".encode(), 256], list("é".encode())[:1]]) == ["héllo", "\ufffd"]


def test_an_unknown_kind_or_a_missing_tokenizer_file_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(DecoderError, match=r"spec\.json: unknown tokenizer kind 'nope'; build the mix again"):
        load_decoder({"kind": "nope"}, tmp_path)
    with pytest.raises(DecoderError, match=r"tokenizer\.json: cannot load it") as e:
        load_decoder({"kind": "bpe"}, tmp_path)
    assert len(str(e.value).splitlines()) == 1
