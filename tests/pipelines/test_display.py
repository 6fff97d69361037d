"""``pipelines/display.py``: what a build shows as it runs. A step line names the stage and its partition; warnings
logged under ``weir`` reach ``say`` as ``warning:`` lines only while the block runs; progress events become
progress bars; either way the loggers are left as they were, however the block ends."""

from __future__ import annotations

import io
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from mixing.ingest.documents import PROGRESS_LOG, TokenizeProgress
from pipelines.display import progress_display, step_line, warnings_to

NAMES = st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=16)


@settings(max_examples=100)
@given(stage=NAMES, partition=st.one_of(st.none(), NAMES))
def test_a_step_line_names_the_stage_and_its_partition(stage: str, partition: str | None) -> None:
    line = step_line(stage, partition)
    assert line == (f"  {stage} [{partition}]" if partition else f"  {stage}")


@settings(max_examples=50)
@given(
    records=st.lists(
        st.tuples(
            st.sampled_from(["weir", "weir.documents", "weir.chunks", "other"]),
            st.sampled_from([logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR]),
            st.text(st.characters(blacklist_categories=["Cs"]), max_size=20),
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
