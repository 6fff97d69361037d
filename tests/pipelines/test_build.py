"""``pipelines/build.py``: the in-process build. Every stage's run is recorded in the instance given, in the stage
table's order, one line said per run; the stages' warnings reach ``say`` as ``warning:`` lines (and only while
the build runs); a failing stage stops the build with the stage's own error; progress
events become progress bars, and the loggers are left as they were. (The order against the table:
``test_stage_table.py``; reuse across builds: ``test_incremental.py``.)"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import dagster as dg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from contract.errors import WeirError
from mixing import load_mix
from mixing.ingest.documents import PROGRESS_LOG, TokenizeProgress
from mixing.stages import STAGES
from pipelines.build import build_mix, progress_display, step_line, warnings_to

NAMES = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=16)


@settings(max_examples=100, deadline=None)
@given(stage=NAMES, partition=st.one_of(st.none(), NAMES))
def test_a_step_line_names_the_stage_and_its_partition(stage: str, partition: str | None) -> None:
    line = step_line(stage, partition)
    assert line == (f"  {stage} [{partition}]" if partition else f"  {stage}")


@settings(max_examples=50, deadline=None)
@given(
    records=st.lists(
        st.tuples(
            st.sampled_from(["weir", "weir.documents", "weir.chunks", "other"]),
            st.sampled_from([logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR]),
            st.text(st.characters(blacklist_categories=("Cs",)), max_size=20),
        ),
        max_size=8,
    )
)
def test_warnings_under_weir_reach_say_while_the_block_runs(records: list[tuple[str, int, str]]) -> None:
    said: list[str] = []
    handlers = {n: list(logging.getLogger(n).handlers) for n in ("weir", "other")}
    with pytest.raises(KeyError), warnings_to(said.append):
        for name, level, message in records:
            logging.getLogger(name).log(level, "%s", message)
        raise KeyError("the block fails: the handler goes anyway")
    logging.getLogger("weir").warning("after the block")
    expected = [f"  warning: {m}" for n, lvl, m in records if n.startswith("weir") and lvl >= logging.WARNING]
    assert said == expected
    assert {n: list(logging.getLogger(n).handlers) for n in handlers} == handlers


def test_progress_events_become_bars_and_the_logger_is_left_as_it_was() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=300, force_terminal=False, color_system=None)
    level, handlers = PROGRESS_LOG.level, list(PROGRESS_LOG.handlers)
    with progress_display(console):
        for done in (1, 3):
            ev = TokenizeProgress("qa", done, 3, 40 * done, 0.5 * done, 2.0, done, 3)
            PROGRESS_LOG.info(str(ev), extra={"progress": ev})
        PROGRESS_LOG.info("a record without an event is ignored")
    text = buf.getvalue()
    assert "tokenize qa" in text and "3/3" in text and "120 docs, 3/3 chunks, 1.5 MB, 2.0 MB/s" in text
    assert (PROGRESS_LOG.level, PROGRESS_LOG.handlers) == (level, handlers)


def test_every_run_is_recorded_in_the_instance_in_order_and_warnings_are_said(
    tiny_mix_path: Path, tmp_path: Path
) -> None:
    qa = tmp_path / "data" / "qa.jsonl"
    qa.write_text(qa.read_text() + json.dumps({"q": "where is the answer?"}) + "\n")
    mix = load_mix(tiny_mix_path)
    instance = dg.DagsterInstance.ephemeral()
    said: list[str] = []
    build_mix(mix, tmp_path / "out", say=said.append, instance=instance)

    runs = [(s.name, p) for s in STAGES for p in s.partitions(mix)]
    assert [line for line in said if not line.startswith("  warning: ")] == [step_line(s, p) for s, p in runs]
    warnings = [line for line in said if line.startswith("  warning: ")]
    assert any("lack template field 'a'" in w for w in warnings), said
    recorded = sorted(
        (r.timestamp, r.asset_key.path[-1], r.partition_key)
        for s in STAGES
        for r in instance.fetch_materializations(dg.AssetKey(["tiny", s.name]), limit=100).records
    )
    assert [(stage, partition) for _t, stage, partition in recorded] == runs, "each run once, in the table's order"
    assert (tmp_path / "out" / "shards" / "manifest.json").is_file()


def test_a_failing_stage_stops_the_build_with_its_own_error(tiny_mix_path: Path, tmp_path: Path) -> None:
    tiny_mix_path.write_text(tiny_mix_path.read_text().replace("max_epochs: 50}", "max_epochs: 1}"))  # infeasible
    mix = load_mix(tiny_mix_path)
    instance = dg.DagsterInstance.ephemeral()
    said: list[str] = []
    with pytest.raises(Exception) as e:
        build_mix(mix, tmp_path / "out", say=said.append, instance=instance)
    # the stage's own error: raised as it is, or wrapped in Dagster's step error (what the CLI unwraps)
    error = getattr(e.value, "user_exception", None) or e.value
    assert isinstance(error, WeirError) and "source 'qa' runs out in phase 'second'" in str(error)
    assert said[-1] == step_line("plan", None), "the build stops at the failing stage"
    assert instance.get_latest_materialization_event(dg.AssetKey(["tiny", "length_stats"])) is not None
    assert instance.get_latest_materialization_event(dg.AssetKey(["tiny", "packed_shards"])) is None
    assert not (tmp_path / "out" / "shards" / "manifest.json").exists()
