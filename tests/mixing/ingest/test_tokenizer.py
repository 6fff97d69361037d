"""Tokenizers: real HF and tiktoken vocabularies offline, trained BPE, bytes; BOS/EOS; fingerprints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from contract.errors import WeirError
from mixing import load_mix
from mixing.ingest.tokenizer import load_tokenizer, prepare_tokenizer
from mixing.mixfile.mix import TokenizerSpec
from tests.conftest import shared_path

TEXTS = ["Hello, world!", "def f(x):\n    return x * 2\n", "Ünïcödé ✓ 数学", "a <|endoftext|> in text"]


def check_flat_matches_batch(tok) -> None:  # type: ignore[no-untyped-def]
    ids, lengths = tok.encode_flat(TEXTS)
    batch = tok.encode_batch(TEXTS)
    assert ids.dtype == np.dtype("<u4") and lengths.dtype == np.int64
    assert lengths.tolist() == [len(b) for b in batch]
    assert ids.tolist() == [t for b in batch for t in b]


def test_hf_tokenizer_json_real_vocabulary(tmp_path: Path) -> None:
    path = shared_path("tokenizers", "deepseek_tokenizer.json")
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(path))
    eos = "<｜end▁of▁sentence｜>"
    spec = TokenizerSpec(kind="hf", path=str(path), eos_token=eos)
    tok = prepare_tokenizer(spec, tmp_path, [])
    assert tok.encode_batch(TEXTS[:1])[0] == [*raw.encode(TEXTS[0], add_special_tokens=False).ids, raw.token_to_id(eos)]
    check_flat_matches_batch(tok)
    bos = prepare_tokenizer(spec.model_copy(update={"bos": True, "bos_token": "<｜begin▁of▁sentence｜>"}), tmp_path, [])
    first = bos.encode_batch(TEXTS[:1])[0]
    assert first[0] == raw.token_to_id("<｜begin▁of▁sentence｜>") and first[1:] == tok.encode_batch(TEXTS[:1])[0]
    assert bos.fingerprint != tok.fingerprint


def test_tiktoken_by_name_from_the_offline_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(shared_path("tokenizers", "tiktoken_cache")))
    import tiktoken

    tok = load_tokenizer(TokenizerSpec(kind="tiktoken", name="o200k_base"), tmp_path)
    enc = tiktoken.get_encoding("o200k_base")
    assert tok.encode_batch(TEXTS) == [[*enc.encode_ordinary(t), enc.eot_token] for t in TEXTS]
    check_flat_matches_batch(tok)
    noeos = load_tokenizer(TokenizerSpec(kind="tiktoken", name="o200k_base", eos=False), tmp_path)
    assert noeos.encode_batch(TEXTS[:1])[0] == enc.encode_ordinary(TEXTS[0])
    assert noeos.fingerprint != tok.fingerprint


def test_tiktoken_unknown_name_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(WeirError, match="TIKTOKEN_CACHE_DIR"):
        load_tokenizer(TokenizerSpec(kind="tiktoken", name="no_such_encoding"), tmp_path)


def test_bpe_is_trained_once_per_sample(tmp_path: Path) -> None:
    spec = TokenizerSpec(kind="bpe", vocab_size=300)
    sample = [f"the cat {i} sat on the mat " * 5 for i in range(50)]
    tok = prepare_tokenizer(spec, tmp_path, iter(sample))
    check_flat_matches_batch(tok)
    mtime = (tmp_path / "tokenizer.json").stat().st_mtime_ns
    again = prepare_tokenizer(spec, tmp_path, iter(sample))  # same sample: kept, same fingerprint
    assert (tmp_path / "tokenizer.json").stat().st_mtime_ns == mtime and again.fingerprint == tok.fingerprint
    prepare_tokenizer(spec, tmp_path, iter([*sample, "something else entirely"]))
    assert (tmp_path / "tokenizer.json").stat().st_mtime_ns != mtime


def test_bytes_bos_eos(tmp_path: Path) -> None:
    tok = load_tokenizer(TokenizerSpec(kind="bytes", bos=True), tmp_path)
    assert tok.encode_batch(["ab"]) == [[256, 97, 98, 256]]
    check_flat_matches_batch(tok)


def test_an_hf_path_under_an_env_variable_opens_the_file_and_never_shows_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained = prepare_tokenizer(TokenizerSpec(kind="bpe", vocab_size=300), tmp_path / "bpe", iter(TEXTS * 20))
    secret = tmp_path / "s3cr3t-models"
    secret.mkdir()
    (secret / "tok.json").write_bytes((tmp_path / "bpe" / "tokenizer.json").read_bytes())
    monkeypatch.setenv("WEIR_TEST_MODELS", str(secret))
    mix_file = tmp_path / "m.yaml"
    mix_file.write_text(
        "name: m\ntokenizer: {kind: hf, path: '{env_WEIR_TEST_MODELS}/tok.json', eos_token: '<|endoftext|>'}\n"
        "sequence: {length: 64, global_batch: 2}\nsources:\n  a: {uri: 'x/*.txt'}\n"
        "curriculum:\n  - {phase: one, steps: 2, mixture: {a: 1}}\n"
    )
    mix = load_mix(mix_file)
    assert "s3cr3t" not in str(mix.tokenizer.path)  # the spec keeps the placeholder
    tok = prepare_tokenizer(mix.tokenizer, tmp_path / "out", [])
    assert tok.encode_batch(TEXTS[:1])[0][:-1] == trained.encode_batch(TEXTS[:1])[0][:-1]
    assert "s3cr3t" not in (tmp_path / "out" / "spec.json").read_text()
