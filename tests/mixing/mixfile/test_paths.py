"""mixing/mixfile/paths.py: the paths a mix file names, checked against real files in tmp_path. Each mistake is
one line naming file, line and field (the mix file's error format); a valid mix has no problem and no note."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mixing.mixfile.mix import load_mix
from mixing.mixfile.paths import PathCheck, check_paths
from tests.conftest import moto_endpoint

# line 2: tokenizer, line 5: sources.notes.uri
MIX = """\
name: m
tokenizer: TOK
sequence: {length: 64, global_batch: 2}
sources:
  notes: {uri: "URI"}
curriculum:
  - {phase: one, steps: 4, mixture: {notes: 1.0}}
"""
HF = '{kind: hf, path: "tok/tokenizer.json", eos_token: "</s>"}'
VAR = "WEIR_TEST_PATHS_ROOT"


def mix_file(tmp_path: Path, uri: str = "data/*.txt", tok: str = HF) -> Path:
    """``tmp_path/cfg/m.yaml`` beside ``cfg/data/a.txt`` and ``cfg/tok/tokenizer.json``; ``URI``/``TOK`` filled in."""
    cfg = tmp_path / "cfg"
    (cfg / "data").mkdir(parents=True, exist_ok=True)
    (cfg / "data" / "a.txt").write_text("one document\n")
    (cfg / "tok").mkdir(exist_ok=True)
    (cfg / "tok" / "tokenizer.json").write_text("{}")
    path = cfg / "m.yaml"
    path.write_text(MIX.replace("URI", uri).replace("TOK", tok))
    return path


def check(path: Path, **kwargs: object) -> PathCheck:
    return check_paths(load_mix(path), **kwargs)  # type: ignore[arg-type]


def test_a_valid_mix_has_no_problem_and_no_note_from_any_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = mix_file(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")  # relative paths start at the mix file's folder, not here
    assert check(path) == PathCheck([], [])
    # a path written another way reaches the same file, in the same spelling
    other = mix_file(tmp_path, uri="{mix_dir}/../cfg/./data//*.txt", tok=HF.replace("tok/", "{mix_dir}/tok/../tok/"))
    assert check(other) == PathCheck([], [])
    assert load_mix(other).tokenizer.path == load_mix(path).tokenizer.path == str(tmp_path / "cfg/tok/tokenizer.json")


def test_a_glob_that_matches_no_file_is_one_line_naming_line_and_field(tmp_path: Path) -> None:
    path = mix_file(tmp_path, uri="data/*.jsonl")
    problems, notes = check(path)
    assert problems == [
        f"{path}:5: sources.notes.uri: no file matches '{tmp_path}/cfg/data/*.jsonl'; expected at least one "
        "(for the demo mix, run `weir demo-data` first)"
    ]
    assert notes == []
    assert check(path, list_sources=False) == PathCheck([], [])  # for plan and build, which list next anyway


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda tok: (tok / "tokenizer.json").unlink(), "tokenizer.path: no such file '{tok}/tokenizer.json'"),
        (lambda tok: ((tok / "tokenizer.json").unlink(), (tok / "tokenizer.json").mkdir()), "is not a file"),
    ],
)
def test_a_tokenizer_file_that_is_not_there_is_one_line(tmp_path: Path, make: object, words: str) -> None:
    path = mix_file(tmp_path)
    make(tmp_path / "cfg" / "tok")  # type: ignore[operator]
    problems, _ = check(path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: "), problems
    assert words.format(tok=tmp_path / "cfg" / "tok") in problems[0], problems


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads a file of mode 000")
def test_an_unreadable_tokenizer_file_is_one_line(tmp_path: Path) -> None:
    path = mix_file(tmp_path)
    tok = tmp_path / "cfg" / "tok" / "tokenizer.json"
    tok.chmod(0)
    try:
        problems, _ = check(path)
    finally:
        tok.chmod(0o644)
    assert len(problems) == 1 and problems[0].startswith(f"{path}:2: tokenizer.path: cannot read"), problems


def test_a_tokenizer_path_that_its_kind_does_not_read_is_a_note(tmp_path: Path) -> None:
    path = mix_file(tmp_path, tok='{kind: bytes, path: "nowhere.json"}')
    assert check(path) == PathCheck(
        [], [f"{path}:2: tokenizer.path: not used by kind 'bytes' (only kind 'hf' reads a file)"]
    )


def test_a_placeholder_left_in_a_path_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = mix_file(tmp_path, uri="{{mix_dir}}/data/*.txt")  # doubled braces: a literal {mix_dir}
    problems, _ = check(path)
    assert len(problems) == 1 and problems[0].startswith(f"{path}:5: sources.notes.uri: expanding it leaves the "), (
        problems
    )
    assert "placeholder {mix_dir} in" in problems[0]

    monkeypatch.setenv(VAR, "{mix_dir}/data")  # a variable's value is not expanded again
    problems, _ = check(mix_file(tmp_path, uri=f"{{env_{VAR}}}/*.txt"))
    assert len(problems) == 1 and "leaves the placeholder {mix_dir}" in problems[0], problems


def test_a_variable_not_set_is_one_line_and_a_set_one_is_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = mix_file(tmp_path, uri=f"{{env_{VAR}}}/*.txt", tok=HF.replace("tok/", f"{{env_{VAR}}}/../tok/"))
    monkeypatch.delenv(VAR, raising=False)
    problems, _ = check(path)
    assert problems == [
        f"{path}:2: tokenizer.path: environment variable {VAR} is not set; expected it set where weir runs "
        f"(the path expands {{env_{VAR}}})",
        f"{path}:5: sources.notes.uri: environment variable {VAR} is not set; expected it set where weir runs "
        f"(the path expands {{env_{VAR}}})",
    ]
    monkeypatch.setenv(VAR, str(tmp_path / "cfg" / "data"))
    assert check(path) == PathCheck([], [])
    (tmp_path / "cfg" / "data" / "a.txt").unlink()
    problems, _ = check(path)
    assert problems == [
        f"{path}:5: sources.notes.uri: no file matches '{{env_{VAR}}}/*.txt'; expected at least one "
        "(for the demo mix, run `weir demo-data` first)"
    ]


def test_an_s3_source_is_a_note_without_storage_options(tmp_path: Path) -> None:
    path = mix_file(tmp_path, uri="s3://corpus/notes/*.txt")
    assert check(path) == PathCheck(
        [],
        [
            f"{path}:5: sources.notes.uri: not checked: 's3://corpus/notes/*.txt' is in object storage and no S3 "
            "endpoint or credentials are set (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); weir "
            "build lists it"
        ],
    )


def test_an_s3_source_is_listed_with_storage_options(tmp_path: Path) -> None:
    s3fs = pytest.importorskip("s3fs")
    with moto_endpoint() as url:
        options = {"endpoint_url": url, "key": "testing", "secret": "testing"}
        fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
        fs.mkdir("corpus")
        fs.pipe("corpus/notes/a.txt", b"one document\n")
        assert check(mix_file(tmp_path, uri="s3://corpus/notes/*.txt"), storage_options=options) == PathCheck([], [])
        path = mix_file(tmp_path, uri="s3://corpus/other/*.txt")
        problems, notes = check(path, storage_options=options)
        assert notes == [] and len(problems) == 1, problems
        assert problems[0].startswith(f"{path}:5: sources.notes.uri: no file matches 's3://corpus/other/*.txt'")
