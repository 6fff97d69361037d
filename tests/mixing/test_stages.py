"""``mixing.stages``: :data:`STAGES` is the order and partitioning the module documents, each stage's function
accepts exactly what :meth:`Stage.run` passes it under the table's flags (``storage_options`` only where it
``reads_sources``, ``engine`` only where it ``fans_out``), ``stages_until`` is a prefix of the table; and running
every stage's partitions in the table's order builds the tiny mix, each stage ending with its commit record
(withdrawn first, so a stage that fails leaves none).

That the asset graph, ``weir build`` and ``weir plan --compute`` follow the table: tests/pipelines/test_stage_table.py.
:class:`Stage` itself (partitions, a run's refusals and arguments) and the commit protocol: tests/mixing/test_stage.py.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest

import mixing.stages as stages_mod
from mixing import load_mix
from mixing.engine import LOCAL
from mixing.output.commit import read_commit, verify
from mixing.output.layout import BuildLayout
from mixing.stages import STAGES, stages_until

NAMES = [s.name for s in STAGES]


def documented_order() -> list[tuple[str, bool]]:
    """(stage, per source) in the order the module's docstring gives ("Order: ``a`` (per source) → ...")."""
    doc = " ".join((stages_mod.__doc__ or "").split())
    order = doc[doc.index("Order:") :].split(".")[0]
    return [(m[1], bool(m[2])) for m in re.finditer(r"``(\w+)``( \(per source\))?", order)]


def test_the_table_is_the_documented_order_and_partitioning() -> None:
    assert [(s.name, s.per_source) for s in STAGES] == documented_order()
    assert all(s.deps for s in STAGES[1:]), "every stage after the first reads an earlier one"


def test_each_stage_function_takes_what_the_table_says_run_passes_it() -> None:
    mix, layout = object(), object()
    for s in STAGES:
        params = inspect.signature(s.fn).parameters
        assert ("storage_options" in params) == s.reads_sources, f"{s.name}: storage_options vs reads_sources"
        assert ("engine" in params) == s.fans_out, f"{s.name}: engine vs fans_out"
        args = (mix, layout, "src") if s.per_source else (mix, layout)
        kwargs: dict[str, Any] = {"storage_options": None} if s.reads_sources else {}
        inspect.signature(s.fn).bind(*args, **kwargs, **({"engine": LOCAL} if s.fans_out else {}))
        if s.ahead is not None:
            assert s.per_source, f"{s.name}: ahead starts every partition's work, so the stage has partitions"
            ahead = inspect.signature(s.ahead).parameters
            assert ("storage_options" in ahead) == s.reads_sources and "engine" in ahead, s.name
            inspect.signature(s.ahead).bind(mix, layout, **kwargs, engine=LOCAL)


def test_stages_until_is_the_prefix_ending_at_the_stage() -> None:
    for i, name in enumerate(NAMES):
        assert stages_until(name) == STAGES[: i + 1]
    with pytest.raises(KeyError) as e:
        stages_until("dedup")
    assert "dedup" in str(e.value) and all(n in str(e.value) for n in NAMES)


def test_running_the_table_in_order_builds_the_mix_and_commits_each_stage(tiny_mix_path: Path, tmp_path: Path) -> None:
    mix = load_mix(tiny_mix_path)
    layout = BuildLayout(tmp_path / "build")
    store = layout.store()
    for s in STAGES:
        assert s.run_ahead(mix, layout) == 0, "the local engine starts nothing ahead"
        for part in s.partitions(mix):
            summary = s.run(mix, layout, part)
            hint = inspect.signature(s.fn, eval_str=True).return_annotation
            if isinstance(hint, type) and not getattr(hint, "_is_protocol", False):
                assert isinstance(summary, hint), (s.name, type(summary))
            record = read_commit(store, s.name, part)
            assert record is not None, (s.name, part)
            assert record.files and verify(store, record) == [], (s.name, part)
    assert (layout.shards_dir / "manifest.json").is_file()

    # a stage run again withdraws its record first: one that fails leaves none, the others stay
    (layout.source_dir("qa") / "docs.parquet").unlink()
    with pytest.raises(Exception):  # noqa: B017 - whatever reading a missing file raises
        stages_until("length_stats")[-1].run(mix, layout)
    assert read_commit(store, "length_stats", None) is None
    assert all(
        read_commit(store, s.name, p) is not None for s in STAGES if s.name != "length_stats" for p in s.partitions(mix)
    )
