"""``pipelines/instance.py``: the project's Dagster instance. The home is the one given, else ``$DAGSTER_HOME``,
else the project's ``.dagster_home``, made absolute and created with telemetry off (a ``dagster.yaml`` already
there is kept); creators of one fresh instance at once all get a working one, and what one records the
others read."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import dagster as dg
import pytest

import pipelines.instance
from pipelines import PROJECT_ROOT
from pipelines.instance import dagster_home, project_instance


def test_the_home_is_the_given_one_else_dagster_home_else_the_projects(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    given = dagster_home(Path("given/home"))
    assert given == tmp_path / "given" / "home" and given.is_absolute()
    assert (given / "dagster.yaml").read_text() == "telemetry:\n  enabled: false\n"

    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "env"))
    assert dagster_home() == tmp_path / "env" and (tmp_path / "env" / "dagster.yaml").is_file()
    assert dagster_home(tmp_path / "explicit") == tmp_path / "explicit", "the given home wins"

    monkeypatch.delenv("DAGSTER_HOME")
    assert pipelines.instance.PROJECT_ROOT == PROJECT_ROOT
    monkeypatch.setattr(pipelines.instance, "PROJECT_ROOT", tmp_path / "checkout")  # never the real checkout's
    assert dagster_home() == tmp_path / "checkout" / ".dagster_home"


def test_a_dagster_yaml_already_there_is_kept(tmp_path: Path) -> None:
    cfg = tmp_path / "home" / "dagster.yaml"
    cfg.parent.mkdir()
    cfg.write_text("telemetry:\n  enabled: false\nretention: {}\n")
    dagster_home(tmp_path / "home")
    assert cfg.read_text() == "telemetry:\n  enabled: false\nretention: {}\n"


def test_creators_of_one_fresh_instance_at_once_all_get_a_working_one(tmp_path: Path) -> None:
    home = tmp_path / "home"
    start = threading.Barrier(4)

    def create() -> int:  # each opens the lock file anew: the flock excludes them as it does processes
        start.wait()
        return len(project_instance(home).get_runs())

    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda _i: create(), range(4))) == [0] * 4

    instance = project_instance(home)
    assert instance.root_directory == str(home.resolve())

    @dg.asset
    def recorded() -> None:
        return None

    assert dg.materialize([recorded], instance=instance).success
    again = project_instance(home)  # another process's view: the same storage
    assert again.get_latest_materialization_event(dg.AssetKey("recorded")) is not None
