"""``mixing.stages``: :data:`STAGES` is the order and partitioning the module documents, each stage's function
accepts exactly what :meth:`Stage.run` passes it under the table's flags (``storage_options`` only where it
``reads_sources``, ``engine`` only where it ``fans_out``), :meth:`Stage.run` refuses a partition that does not
fit the stage, ``stages_until`` is a prefix of the table; and running every stage's partitions in the table's
order builds the tiny mix, each stage ending with its commit record (withdrawn first, so a stage that fails
leaves none).

That the asset graph, ``weir build`` and ``weir plan --compute`` follow the table: tests/pipelines/test_stage_table.py.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mixing.stages as stages_mod
from mixing import load_mix
from mixing.engine import LOCAL
from mixing.mixfile.mix import Mix, parse_mix
from mixing.output.commit import read_commit, verify
from mixing.output.layout import BuildLayout
from mixing.stages import STAGES, Stage, stages_until

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


def mix_with(sources: list[str]) -> Mix:
    text = (
        "name: m\nsequence: {length: 64, global_batch: 1}\nsources:\n"
        + "".join(f"  '{n}': {{uri: x}}\n" for n in sources)  # quoted: YAML reads a bare `no` as false
        + f"curriculum:\n  - {{phase: p, steps: 1, mixture: {{'{sources[0]}': 1}}}}\n"
    )
    return parse_mix(text)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True), min_size=1, max_size=5, unique=True))
def test_partitions_are_the_sources_sorted_or_one_run(sources: list[str]) -> None:
    mix = mix_with(sources)
    for s in STAGES:
        assert s.partitions(mix) == (sorted(sources) if s.per_source else [None]), s.name


@pytest.mark.parametrize("stage", NAMES)
def test_run_refuses_a_partition_that_does_not_fit_the_stage(stage: str, tmp_path: Path) -> None:
    s = next(x for x in STAGES if x.name == stage)
    mix = mix_with(["a", "b"])
    with pytest.raises(ValueError, match=re.escape(repr(stage))) as e:
        s.run(mix, BuildLayout(tmp_path / "out"), None if s.per_source else "a")
    assert len(str(e.value).splitlines()) == 1
    assert not (tmp_path / "out").exists(), "refused before anything ran"


@settings(max_examples=16, deadline=None)
@given(per_source=st.booleans(), reads=st.booleans(), fans_out=st.booleans())
def test_run_passes_the_partition_storage_options_and_engine_as_flagged(
    per_source: bool, reads: bool, fans_out: bool
) -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def fn(*args: Any, **kwargs: Any) -> str:
        calls.append((args, kwargs))
        return "summary"

    s = Stage("x", per_source=per_source, deps=(), fn=fn, reads_sources=reads, fans_out=fans_out)
    mix, layout, options, engine = mix_with(["a"]), BuildLayout(Path("unused")), {"key": "k"}, object()
    assert s.run(mix, layout, "a" if per_source else None, options, engine) == "summary"  # type: ignore[arg-type]
    ((args, kwargs),) = calls
    assert args == ((mix, layout, "a") if per_source else (mix, layout))
    assert kwargs == {**({"storage_options": options} if reads else {}), **({"engine": engine} if fans_out else {})}
    assert s.run_ahead(mix, layout) == 0 and len(calls) == 1, "no ahead: nothing started"


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
