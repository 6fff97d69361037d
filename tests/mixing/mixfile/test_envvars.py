"""mixing/mixfile/envvars.py: ``{env_NAME}`` in a source URI. A registered variable's value never survives
:func:`redact` (in any spelling it lists: as set, without its trailing slash, normalized), :func:`expand` turns a
shown path back into the real one, only registered placeholders are expanded, the longest value wins, and a name
that looks like a credential is refused in one line.

(A whole build that never shows the value: tests/faults/test_mixfile_secrets.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mixing.mixfile import envvars
from mixing.mixfile.envvars import PLACEHOLDER, expand, redact, refusal, register, replacements
from mixing.mixfile.mix import parse_mix


@contextmanager
def registered(**values: str | None) -> Iterator[None]:
    """Only these variables registered (the process-wide set swapped for a fresh one), set to these values
    (None: unset)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(envvars, "_NAMES", set())
        for name, value in values.items():
            if value is None:
                mp.delenv(name, raising=False)
            else:
                mp.setenv(name, value)
        register(set(values))
        yield


SEGMENT = st.text("xyz._-", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
# A real place: an absolute path, perhaps with doubled or trailing slashes (as a user may set it)
VALUE = st.builds(
    lambda segs, seps, tail: "/" + "".join(s + sep for s, sep in zip(segs, seps, strict=False)) + segs[-1] + tail,
    st.lists(SEGMENT, min_size=1, max_size=4),
    st.lists(st.sampled_from(["/", "//"]), max_size=4),
    st.sampled_from(["", "/", "//"]),
)
REST = st.lists(st.text("ABC0123", min_size=1, max_size=5), max_size=3).map("/".join)  # no character of VALUE's


@given(value=VALUE, rest=REST)
def test_a_listed_path_is_shown_without_the_value_and_expands_back(value: str, rest: str) -> None:
    bare = value.rstrip("/")
    path = bare + "/" + rest  # what fsspec lists under the expanded URI
    with registered(WEIR_PLACE=value):
        shown = redact(path)
        assert bare not in shown and os.path.normpath(value) not in shown
        if path.startswith(value):  # the value as set: the shown path expands to this very path
            assert shown == "{env_WEIR_PLACE}" + path[len(value) :] and expand(shown) == path
        else:  # listed without the value's trailing slashes: expands to a spelling of the same file
            assert shown == "{env_WEIR_PLACE}" + path[len(bare) :]
            assert os.path.normpath(expand(shown)) == os.path.normpath(path)


@given(value=VALUE, rest=REST)
def test_a_path_in_its_normalized_spelling_is_hidden_too(value: str, rest: str) -> None:
    norm = os.path.normpath(value)  # fsspec normalizing /data//web/ to /data/web
    path = f"{norm}/{rest}"
    with registered(WEIR_PLACE=value):
        shown = redact(f"cannot open {path}: no such file")
        assert shown.startswith("cannot open {env_WEIR_PLACE}") and norm not in shown
        shown_path = shown.removeprefix("cannot open ").removesuffix(": no such file")
        assert os.path.normpath(expand(shown_path)) == os.path.normpath(path)


@given(text=st.text(max_size=60), value=VALUE)
def test_no_text_keeps_a_registered_value(text: str, value: str) -> None:
    with registered(WEIR_PLACE=value):
        shown = redact(f"{text}{value}{text}{value.rstrip('/')}{text}{os.path.normpath(value)}")
        assert value.rstrip("/") not in shown and os.path.normpath(value) not in shown
        assert redact(shown) == shown  # nothing left to hide


def test_the_longest_value_wins_and_each_expands_to_its_own() -> None:
    with registered(WEIR_ROOT="/data", WEIR_WEB="/data/web/"):
        assert replacements() == [
            ("/data/web/", "{env_WEIR_WEB}"),
            ("/data/web", "{env_WEIR_WEB}"),
            ("/data", "{env_WEIR_ROOT}"),
        ]
        text = "/data/web/a.jsonl and /data/code/b.py"
        shown = redact(text)
        assert shown == "{env_WEIR_WEB}a.jsonl and {env_WEIR_ROOT}/code/b.py"
        assert expand(shown) == text


def test_registered_values_are_hidden_and_any_set_variable_is_expanded_then_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WEIR_NOT_REGISTERED", "/elsewhere")
    monkeypatch.setenv("WEIR_API_KEY", "/k")  # a credential's name: never expanded
    with registered(WEIR_PLACE="/srv/corpus", WEIR_UNSET=None, WEIR_EMPTY=""):
        assert replacements() == [("/srv/corpus", "{env_WEIR_PLACE}")]  # unset and empty: nothing to hide
        assert redact("/srv/corpus/x /elsewhere/y") == "{env_WEIR_PLACE}/x /elsewhere/y"
        text = "{env_WEIR_PLACE}/a {env_WEIR_UNSET}/b {env_WEIR_NOT_REGISTERED}/c {env_1X}/d {mix_dir}/e "
        text += "{env_WEIR_API_KEY}"
        expanded = "/srv/corpus/a {env_WEIR_UNSET}/b /elsewhere/c {env_1X}/d {mix_dir}/e {env_WEIR_API_KEY}"
        assert expand(text) == expanded
        # a process that expands a path it was handed (a Ray worker) hides that value from then on
        assert redact("/elsewhere/y") == "{env_WEIR_NOT_REGISTERED}/y"
        assert expand("/plain/path") == "/plain/path"


def test_a_fresh_process_that_validated_no_mix_reads_a_shown_path(tmp_path: Path) -> None:
    """What a Ray worker does: it gets a source's spec and a shown path, and opens the file."""
    (tmp_path / "a.jsonl").write_text('{"text": "kept"}\n')
    code = (
        "import sys; from mixing.ingest.formats import read_file; from mixing.mixfile.parts import SourceSpec\n"
        "spec = SourceSpec(uri='{env_WEIR_DATA_ROOT}/*.jsonl', format='jsonl')\n"
        "print([(r.file, r.text, r.reason) for r in read_file('{env_WEIR_DATA_ROOT}/a.jsonl', spec)])"
    )
    env = {**os.environ, "WEIR_DATA_ROOT": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[('{env_WEIR_DATA_ROOT}/a.jsonl', 'kept', None)]"


MIX = """\
name: m
sequence: {{length: 64, global_batch: 2}}
sources:
  a: {{uri: "{uri}"}}
curriculum:
  - {{phase: one, steps: 2, mixture: {{a: 1}}}}
"""


def test_a_validated_mix_file_registers_its_variables_and_registering_only_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WEIR_FROM_MIX", "/from/mix")
    monkeypatch.setenv("WEIR_LATER", "/later")
    with registered(WEIR_FIRST="/first"):
        assert redact("/from/mix/x") == "/from/mix/x"  # not registered yet: not hidden
        parse_mix(MIX.format(uri="{env_WEIR_FROM_MIX}/*.txt"), "m.yaml")
        assert redact("/from/mix/x /first/y") == "{env_WEIR_FROM_MIX}/x {env_WEIR_FIRST}/y"
        register({"WEIR_LATER"})
        assert redact("/from/mix/x /first/y /later/z") == "{env_WEIR_FROM_MIX}/x {env_WEIR_FIRST}/y {env_WEIR_LATER}/z"
        assert expand("{env_WEIR_FROM_MIX}/x {env_WEIR_LATER}/z") == "/from/mix/x /later/z"


CREDENTIALS = [
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SESSION_TOKEN",
    "HF_TOKEN",
    "DB_PASSWORD",
    "passwd",
    "API_KEY",
    "APIKEY",
    "OPENAI_API_KEY",
    "KEY",
    "my_key_file",
    "GITHUB_AUTH",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "PRIVATE_BUCKET",
]
PLACES = ["DATA_ROOT", "HOME", "BUCKET", "S3_PREFIX", "MONKEY_DIR", "KEYNOTE", "TURKEY", "CORPUS_2024", "_X"]


@pytest.mark.parametrize("name", CREDENTIALS)
def test_a_name_that_looks_like_a_credential_is_refused_in_one_line(name: str) -> None:
    why = refusal(name)
    assert why is not None and why.startswith(f"{{env_{name}}} looks like a credential") and "\n" not in why
    assert PLACEHOLDER.fullmatch(f"{{env_{name}}}")


@pytest.mark.parametrize("name", PLACES)
def test_a_name_of_a_place_is_allowed(name: str) -> None:
    assert refusal(name) is None and PLACEHOLDER.fullmatch(f"{{env_{name}}}")


@given(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
    st.sampled_from(["SECRET", "token", "Password", "CREDENTIAL", "_KEY", "API_KEY_", "AUTH", "SESSION"]),
)
def test_a_credential_word_anywhere_in_a_name_refuses_it(stem: str, word: str) -> None:
    assert refusal(stem + word) is not None
