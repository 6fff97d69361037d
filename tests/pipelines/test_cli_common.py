"""``pipelines/cli_common.py``: what every ``weir`` command shares. A mix file that does not load is one line naming
its file, line and field, and exit 2; a missed goal is one ``goal missed`` line, exit 4 only under ``--strict``; a
build argument is its folder whether ``shards/`` is named or not; a tokenizer that is not there stops both ``weir
build`` and ``weir plan`` before any work."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from pipelines.cli_common import STRICT_EXIT, build_root, exit_if_missed, load_mix_or_exit
from tests.pipelines.cli_helpers import tiny_mix, weir_in


def test_load_mix_or_exit_returns_the_mix_or_exits_2_with_one_line(
    tiny_mix_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert load_mix_or_exit(tiny_mix_path).name == "tiny"
    bad = tmp_path / "bad.yaml"
    text = tiny_mix_path.read_text()
    assert "max_epochs: 50}" in text
    bad.write_text(text.replace("max_epochs: 50}", "max_epoch: 50}", 1))  # on line 6, the notes source
    with pytest.raises(typer.Exit) as e:
        load_mix_or_exit(bad)
    assert e.value.exit_code == 2
    said = capsys.readouterr()
    assert said.out == "" and said.err.count("\n") == 1, said
    assert said.err.startswith(f"invalid mix file: {bad}:6: sources.notes.max_epoch: unknown field"), said.err


def test_exit_if_missed_names_the_goals_in_one_line_and_exits_only_when_strict(
    capsys: pytest.CaptureFixture[str],
) -> None:
    exit_if_missed([], strict=True)  # nothing missed: nothing said, no exit
    assert capsys.readouterr() == ("", "")
    exit_if_missed(["packing_efficiency 0.91 < 0.99", "truncated_docs 3 > 0"], strict=False)
    assert capsys.readouterr() == ("", "goal missed: packing_efficiency 0.91 < 0.99; truncated_docs 3 > 0\n")
    with pytest.raises(typer.Exit) as e:
        exit_if_missed(["truncated_docs 3 > 0"], strict=True, quiet=True)
    assert e.value.exit_code == STRICT_EXIT == 4
    assert capsys.readouterr() == ("", "")  # quiet (--json): stderr keeps to errors


def test_build_root_is_the_build_folder_with_or_without_its_shards(tmp_path: Path) -> None:
    assert build_root(str(tmp_path / "b")) == tmp_path / "b"
    assert build_root(str(tmp_path / "b" / "shards")) == tmp_path / "b"


@pytest.mark.parametrize("command", ["build", "plan"])
def test_build_and_plan_refuse_a_missing_tokenizer_before_any_work(tmp_path: Path, command: str) -> None:
    mix = tiny_mix(tmp_path, ("tok/tokenizer.json", "tok/absent.json"))
    out = tmp_path / "out"
    r = weir_in(tmp_path, command, str(mix), "--out" if command == "build" else "--build", str(out))
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == (
        f"invalid mix file: {mix}:3: tokenizer.path: no such file '{mix.parent}/tok/absent.json'; expected a "
        "tokenizer.json (a relative path starts at the mix file's folder)\n"
    )
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cfg"]
