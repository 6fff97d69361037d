"""Padding: the tokenizer's own pad token when it has one (never a document's EOS); EOS otherwise, with the
fingerprint (hence every build made without a pad token) unchanged."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loaders import IGNORE_INDEX, PackedDataset, World
from mixing.ingest.tokenizer import EOS, prepare_tokenizer, train_bpe
from mixing.mixfile.mix import TokenizerSpec
from tests.conftest import ROOT, TINY_MIX, shared_path, write_tiny_sources

DEEPSEEK_EOS, DEEPSEEK_PAD = "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"


def test_a_hf_tokenizer_pads_with_its_pad_token_not_eos(tmp_path: Path) -> None:
    path = shared_path("tokenizers", "deepseek_tokenizer.json")
    tok = prepare_tokenizer(TokenizerSpec(kind="hf", path=str(path), eos_token=DEEPSEEK_EOS), tmp_path, [])
    added = {t["content"]: t["id"] for t in json.loads(path.read_bytes())["added_tokens"]}
    assert (tok.eos_id, tok.pad_id) == (added[DEEPSEEK_EOS], added[DEEPSEEK_PAD])
    assert tok.pad_id != tok.eos_id


@pytest.mark.parametrize(
    ("special", "padding", "pad"),
    [
        ([EOS], None, None),  # no pad token: EOS, and the fingerprint of before
        ([EOS, "[PAD]"], None, "[PAD]"),
        ([EOS, "<|pad|>"], None, "<|pad|>"),
        ([EOS, "<pad>", "<unk>"], None, "<pad>"),
        ([EOS, "<unk>"], "<unk>", "<unk>"),  # padding.pad_id, whatever its name
        ([EOS, "<|finetune_right_pad_id|>"], None, None),  # a name that merely contains "pad"
    ],
)
def test_pad_token_detection(tmp_path: Path, special: list[str], padding: str | None, pad: str | None) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[assignment]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=special, show_progress=False)  # type: ignore[call-arg]
    raw.train_from_iterator(["hello world"] * 10, trainer)
    if padding:
        raw.enable_padding(pad_id=raw.token_to_id(padding), pad_token=padding)
    raw.save(str(tmp_path / "tokenizer.json"))
    spec = TokenizerSpec(kind="hf", path=str(tmp_path / "tokenizer.json"), eos_token=EOS)
    tok = prepare_tokenizer(spec, tmp_path / "prepared", [])
    assert tok.pad_id == (tok.eos_id if pad is None else raw.token_to_id(pad))
    base = hashlib.sha256((tmp_path / "tokenizer.json").read_bytes()).hexdigest()
    before = hashlib.sha256(f"{base}|bos=None|eos={tok.eos_id}".encode()).hexdigest()
    assert (tok.fingerprint == before) == (pad is None)  # a pad token changes the shards, so the fingerprint


def test_trained_bpe_and_bytes_keep_their_fingerprints(tmp_path: Path) -> None:
    """Builds without a pad token (the demo's trained BPE, bytes) are byte for byte what they were."""
    train_bpe(["some text to train on"] * 20, 300, tmp_path / "tokenizer.json")
    spec = TokenizerSpec(kind="bpe", vocab_size=300)
    tok = prepare_tokenizer(
        spec.model_copy(update={"kind": "hf", "path": str(tmp_path / "tokenizer.json")}), tmp_path / "p", []
    )
    base = hashlib.sha256((tmp_path / "tokenizer.json").read_bytes()).hexdigest()
    assert tok.fingerprint == hashlib.sha256(f"{base}|bos=None|eos={tok.eos_id}".encode()).hexdigest()
    byte = prepare_tokenizer(TokenizerSpec(kind="bytes"), tmp_path / "b", [])
    assert (byte.pad_id, byte.eos_id) == (256, 256)
    bytes_fp = hashlib.sha256(b"bytes-v1").hexdigest()
    assert byte.fingerprint == hashlib.sha256(f"{bytes_fp}|bos=None|eos=256".encode()).hexdigest()


@pytest.mark.slow  # a real build through the CLI (~10 s, more on a loaded machine)
def test_a_build_with_a_pad_token_masks_padding_by_id_without_touching_any_eos(tmp_path: Path) -> None:
    """The issue's trap: ``input_ids == pad_id`` must select exactly the padding slots, and each document
    still ends with EOS (a tokenizer.json dressed as DeepSeek's: EOS and ``<｜▁pad▁｜>``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[assignment]
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(  # type: ignore[call-arg]
        vocab_size=300, special_tokens=[DEEPSEEK_EOS, DEEPSEEK_PAD], initial_alphabet=alphabet, show_progress=False
    )
    raw.train_from_iterator(["Note 1. word1 word2", "Q: what is 1+1? A: 2"] * 10, trainer)
    raw.save(str(tmp_path / "tokenizer.json"))
    write_tiny_sources(tmp_path / "data")
    spec = f'{{kind: hf, path: "{tmp_path / "tokenizer.json"}", eos_token: "{DEEPSEEK_EOS}"}}'
    mix = TINY_MIX.format(root=tmp_path / "data").replace("tokenizer: {kind: bytes}", f"tokenizer: {spec}")
    (tmp_path / "mix.yaml").write_text(mix)
    out = tmp_path / "build"
    cmd = [sys.executable, "-m", "pipelines.cli", "build", str(tmp_path / "mix.yaml"), "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
    ds = PackedDataset(out, world=World(0, 1))
    facts = ds.facts
    assert (facts.eos_id, facts.pad_id, facts.pad_is_eos) == (0, 1, False)
    padding = eos_ends = documents = 0
    for it in ds:
        ids, n, cu = it["input_ids"].numpy(), it["num_tokens"], it["cu_seqlens"].numpy()
        assert np.array_equal(np.flatnonzero(ids == facts.pad_id), np.arange(n, len(ids)))  # mask by id: padding
        assert ((it["labels"].numpy() == IGNORE_INDEX)[n:]).all()
        ends = cu[1:][cu[1:] <= n] - 1  # each document's last token (or a piece of a longer one)
        eos_ends += int((ids[ends] == facts.eos_id).sum())
        documents += len(ends)
        padding += len(ids) - n
    assert padding > 0 and eos_ends > documents // 2  # padding exists; documents (not pieces) end with EOS
