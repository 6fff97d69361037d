"""The mix file: valid files load; every invalid one names file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from mixing import Mix, MixError, load_mix
from mixing.mixfile.mix import parse_mix

ROOT = Path(__file__).resolve().parents[3]

GOOD = """\
name: m
sequence: {length: 128, global_batch: 2}
sources:
  a: {uri: "x/*.txt"}
  b: {uri: "y/*.jsonl", format: jsonl, field: body}
curriculum:
  - phase: one
    steps: 10
    mixture: {a: 0.5, b: 0.5}
  - phase: two
    steps: 5
    mixture:
      a: 0.25
      b: 0.75
"""


def test_demo_mix_is_valid() -> None:
    mix = load_mix(ROOT / "mixes" / "demo.yaml")
    assert len(mix.curriculum) >= 3
    assert len({tuple(sorted(p.mixture.items())) for p in mix.curriculum}) == len(mix.curriculum)


def test_good_mix_round_trips() -> None:
    mix = parse_mix(GOOD, "good.yaml")
    assert mix.total_steps == 15
    assert mix.sources["b"].field == "body"
    assert mix.fingerprint() == parse_mix(GOOD.replace("\n", "\n\n"), "other.yaml").fingerprint()


@pytest.mark.parametrize(
    ("edit", "line", "field", "words"),
    [
        # unknown source in a mixture
        (
            ("a: 0.25\n      b: 0.75", "a: 0.25\n      c: 0.75"),
            14,
            "curriculum[1].mixture.c",
            "unknown source 'c'",
        ),
        # a misspelled source in a mixture: the nearest declared one
        (
            ("a: 0.25\n      b: 0.75", "a: 0.25\n      bb: 0.75"),
            14,
            "curriculum[1].mixture.bb",
            "unknown source 'bb'; did you mean 'b'? expected one of: a, b",
        ),
        # weights that do not sum to 1
        (("mixture: {a: 0.5, b: 0.5}", "mixture: {a: 0.5, b: 0.6}"), 9, "curriculum[0].mixture", "sum to 1"),
        # negative steps
        (("steps: 5", "steps: -5"), 11, "curriculum[1].steps", "greater than 0"),
        # a missing field
        (("sequence: {length: 128, global_batch: 2}\n", ""), 1, "sequence", "missing"),
        # a field of the wrong type
        (("length: 128", "length: lots"), 2, "sequence.length", "integer"),
        # an unknown field
        (("format: jsonl,", "fromat: jsonl,"), 5, "sources.b.fromat", "unknown field"),
        # a source named by a word YAML reads as a boolean
        (("  b:", "  no:"), 3, "sources", "quote it"),
        # YAML syntax error
        (("  - phase: two", "  - phase: [two"), 11, "YAML syntax error", "expected valid YAML"),
    ],
)
def test_invalid_mix_names_line_and_field(edit: tuple[str, str], line: int, field: str, words: str) -> None:
    text = GOOD.replace(*edit)
    assert text != GOOD, "the edit did not apply"
    with pytest.raises(MixError) as e:
        parse_mix(text, "bad.yaml")
    msg = str(e.value)
    assert msg.startswith(f"bad.yaml:{line}: "), msg
    assert field in msg and words in msg, msg
    assert "\n" not in msg


def test_unreadable_file_is_a_mix_error(tmp_path: Path) -> None:
    with pytest.raises(MixError, match="cannot read"):
        load_mix(tmp_path / "absent.yaml")


def test_only_safe_yaml(tmp_path: Path) -> None:
    with pytest.raises(MixError, match="YAML"):
        parse_mix("!!python/object/apply:os.system ['true']\n", "evil.yaml")


def test_a_token_budget_needs_unequal_micro_batches_and_room_for_a_sequence() -> None:
    ok = parse_mix(GOOD + "balance: {micro_batches: unequal, max_tokens: 512}\n", "m.yaml")
    assert ok.balance.max_tokens == 512
    with pytest.raises(MixError, match=r"m.yaml:15: balance: .*micro_batches: unequal"):
        parse_mix(GOOD + "balance: {max_tokens: 512}\n", "m.yaml")
    with pytest.raises(MixError, match=r"m.yaml:15: balance.max_tokens: 100 tokens is less than one sequence"):
        parse_mix(GOOD + "balance: {micro_batches: unequal, max_tokens: 100}\n", "m.yaml")


# --- no mix file gets past validation into a crash, and every problem is one line -------------------


@pytest.mark.parametrize(
    ("edit", "line", "field", "words"),
    [
        # duplicate keys: YAML keeps the last silently; weir names the second one
        (
            ("  - phase: two\n    steps: 5", "  - phase: two\n    steps: 5\n    steps: 6"),
            12,
            "curriculum[1].steps",
            "duplicate key",
        ),
        (("  b: {uri", "  a: {uri: z}\n  b: {uri"), 5, "sources.a", "first on line 4"),
        (("name: m\n", "name: m\nname: n\n"), 2, "name", "duplicate key 'name'"),
        # a run that cannot fit in memory: MemoryError at build time before
        (("steps: 10\n", "steps: 10000000000000\n"), 8, "curriculum[0].steps", "limit of 10,000,000 steps"),
        (("steps: 10\n", "steps: 1" + "0" * 400 + "\n"), 8, "curriculum[0].steps", "about 10^400 steps"),
        (("steps: 10\n", "tokens: 1000000000000000\n"), 8, "curriculum[0].tokens", "expected at most 10,000,000"),
        (("steps: 10\n", "tokens: '" + "9" * 400 + "T'\n"), 8, "curriculum[0].tokens", "limit of 1e+16 tokens"),
        (("{length: 128, global_batch: 2}", "{length: 65536, global_batch: 8192}"), 2, "sequence", "tokens per step"),
        # weights that are not numbers: before, NaN read "greater than or equal to 0"
        (("mixture: {a: 0.5, b: 0.5}", "mixture: {a: .nan, b: 0.5}"), 9, "curriculum[0].mixture.a", "not a finite"),
        (("mixture: {a: 0.5, b: 0.5}", "mixture: {a: .inf, b: 0.5}"), 9, "curriculum[0].mixture.a", "not a finite"),
        (("name: m\n", "name: m\nseed: -1\n"), 2, "seed", "greater than or equal to 0"),
    ],
)
def test_mix_faults_are_one_line_naming_file_line_and_field(
    edit: tuple[str, str], line: int, field: str, words: str
) -> None:
    test_invalid_mix_names_line_and_field(edit, line, field, words)


# --- a misspelled field gets the nearest valid name -----------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "line", "words"),
    [
        (
            ("field: body}", "field: body, max_epoch: 2}"),
            5,
            "sources.b.max_epoch: unknown field 'max_epoch'; did you mean 'max_epochs'?",
        ),
        (("format: jsonl,", "fromat: jsonl,"), 5, "sources.b.fromat: unknown field 'fromat'; did you mean 'format'?"),
        # a misspelled required field: named as misspelled, not as missing
        (("name: m", "nmae: m"), 1, "nmae: unknown field 'nmae'; did you mean 'name'?"),
        (
            ("steps: 5", "steps: 5\n    transition: {shap: linear, steps: 2}"),
            12,
            "curriculum[1].transition.shap: unknown field 'shap'; did you mean 'shape'?",
        ),
        (
            ("name: m", "name: m\nbalance: {regroup: {windw: 4}}"),
            2,
            "balance.regroup.windw: unknown field 'windw'; did you mean 'window'?",
        ),
        (
            ("name: m", "name: m\ntokenizer: {kind: hf, pth: t.json}"),
            2,
            "tokenizer.pth: unknown field 'pth'; did you mean 'path'?",
        ),
        # nothing close: the valid names
        (
            ("name: m", "name: m\ncolour: red"),
            2,
            "colour: unknown field 'colour'; expected one of: name, seed, tokenizer, sequence, sources, curriculum, "
            "balance, normalize, continues (see docs/mix-file.md).",
        ),
    ],
)
def test_a_misspelled_field_gets_the_nearest_valid_name(edit: tuple[str, str], line: int, words: str) -> None:
    text = GOOD.replace(*edit)
    assert text != GOOD, "the edit did not apply"
    with pytest.raises(MixError) as e:
        parse_mix(text, "bad.yaml")
    assert str(e.value).startswith(f"bad.yaml:{line}: {words}"), str(e.value)


# --- one rule for paths: a source's uri and tokenizer.path ----------------------------------------------


def test_tokenizer_path_follows_the_rule_of_a_source_uri(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "cfg"
    cfg.mkdir()
    tok = '\ntokenizer: {kind: hf, path: "PATH", eos_token: "</s>"}\n'

    def load(path: str) -> Mix:
        (cfg / "m.yaml").write_text(GOOD.replace("\n", tok.replace("PATH", path), 1))
        return load_mix(cfg / "m.yaml")

    monkeypatch.chdir(tmp_path)  # not the mix file's folder
    for written in ("tok.json", "./tok.json", "{mix_dir}/tok.json", "{mix_dir}/../cfg/tok.json", f"{cfg}//tok.json"):
        mix = load(written)
        assert mix.tokenizer.path == mix.tokenizer_path() == str(cfg / "tok.json"), written
    assert mix.source_uri("a") == str(cfg / "x" / "*.txt")  # the same rule

    monkeypatch.setenv("WEIR_TEST_TOK_DIR", str(tmp_path / "models"))
    mix = load("{env_WEIR_TEST_TOK_DIR}/tok.json")
    assert mix.tokenizer.path == "{env_WEIR_TEST_TOK_DIR}/tok.json"  # what spec.json and messages hold
    assert mix.tokenizer_path() == str(tmp_path / "models" / "tok.json")  # what is opened
    monkeypatch.delenv("WEIR_TEST_TOK_DIR")
    with pytest.raises(MixError, match=r"m.yaml:2: tokenizer.path: environment variable WEIR_TEST_TOK_DIR is not set"):
        mix.tokenizer_path()
    for written, words in [
        ("{env_HF_TOKEN}/tok.json", "looks like a credential"),
        ("{models}/tok.json", "unknown placeholder {models}"),
    ]:
        with pytest.raises(MixError) as e:
            load(written)
        assert str(e.value).startswith(f"{cfg / 'm.yaml'}:2: tokenizer.path: ") and words in str(e.value), str(e.value)


def test_source_uri_is_normalized_and_keeps_a_normal_path_as_written(tmp_path: Path) -> None:
    text = GOOD.replace("x/*.txt", "{mix_dir}/../data/./x//*.txt").replace("y/*.jsonl", "/data/y/*.jsonl")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "m.yaml").write_text(text)
    mix = load_mix(tmp_path / "cfg" / "m.yaml")
    assert mix.source_uri("a") == mix.shown_uri("a") == f"{tmp_path}/data/x/*.txt"
    assert mix.source_uri("b") == "/data/y/*.jsonl"  # so its files' paths, and the chunk keys, stay as they were
    assert mix.where(("sources", "b", "uri")) == f"{tmp_path / 'cfg' / 'm.yaml'}:5: sources.b.uri"
    assert mix.where(("curriculum", 1, "mixture", "b")) == f"{tmp_path / 'cfg' / 'm.yaml'}:14: curriculum[1].mixture.b"
