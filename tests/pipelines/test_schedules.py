"""``pipelines/schedules.py``: the nightly schedule of a mix, stopped until turned on, asks one run of the mix's job
per source (partition = source) per tick; a tick evaluated twice asks the same run keys (never launches twice),
and two ticks never share one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from assets import WeirEngine, WeirStorage, mix_assets
from mixing import Mix, load_mix
from pipelines.definitions import mix_job
from pipelines.schedules import NIGHTLY_CRON, nightly_schedule
from tests.conftest import TINY_MIX, write_tiny_sources

TICKS = st.datetimes(min_value=datetime(2020, 1, 1), max_value=datetime(2040, 1, 1), timezones=st.just(UTC))


@pytest.fixture(scope="module")
def tiny_mix(tmp_path_factory: pytest.TempPathFactory) -> Mix:
    base = tmp_path_factory.mktemp("schedules")
    write_tiny_sources(base / "data")
    (base / "tiny.yaml").write_text(TINY_MIX.format(root=base / "data"))
    return load_mix(base / "tiny.yaml")


@pytest.fixture(scope="module")
def repo(tiny_mix: Mix) -> dg.RepositoryDefinition:
    """The mix's assets, job and schedule, and nothing else of the definitions."""
    job = mix_job(tiny_mix)
    resources = {"storage": WeirStorage(), "engine": WeirEngine()}
    schedules = [nightly_schedule(tiny_mix, job)]
    defs = dg.Definitions(assets=mix_assets(tiny_mix), jobs=[job], schedules=schedules, resources=resources)
    return defs.get_repository_def()


def requests(repo: dg.RepositoryDefinition, when: datetime) -> list[dg.RunRequest]:
    schedule = repo.get_schedule_def("nightly_tiny")
    data = schedule.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=when, repository_def=repo))
    return list(data.run_requests or [])


def test_the_schedule_is_nightly_stopped_and_targets_the_mix_job(tiny_mix: Mix) -> None:
    mix = tiny_mix
    schedule = nightly_schedule(mix, mix_job(mix))
    assert (schedule.name, schedule.job_name, schedule.cron_schedule) == ("nightly_tiny", "build_tiny", NIGHTLY_CRON)
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    assert nightly_schedule(mix, mix_job(mix), cron="*/5 * * * *").cron_schedule == "*/5 * * * *"


@settings(max_examples=30)
@given(when=TICKS, later=st.timedeltas(min_value=timedelta(seconds=1), max_value=timedelta(days=400)))
def test_one_run_per_source_per_tick_and_one_key_per_tick_and_source(
    tiny_mix: Mix, repo: dg.RepositoryDefinition, when: datetime, later: timedelta
) -> None:
    first = requests(repo, when)
    assert [r.partition_key for r in first] == sorted(tiny_mix.sources)
    assert all(r.tags["weir/trigger"] == "nightly" for r in first)
    keys = [r.run_key for r in first]
    assert len(set(keys)) == len(keys)
    assert [r.run_key for r in requests(repo, when)] == keys, "the same tick evaluated again: the same keys"
    assert not {r.run_key for r in requests(repo, when + later)} & set(keys), "another tick: other keys"
