"""``mixing.stage``: :meth:`Stage.partitions` is the sources sorted or one run, :meth:`Stage.run` refuses a
partition that does not fit the stage and passes ``storage_options`` and ``engine`` only as flagged; :func:`begin`
withdraws the stage's commit record and :func:`publish` writes one listing the files (copied to the build root
when it is elsewhere) and the entries workers published.

That every stage function keeps the protocol, run in the table's order: tests/mixing/test_stages.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.store import sha256_file
from mixing.mixfile.mix import Mix, parse_mix
from mixing.output.commit import read_commit, verify
from mixing.output.layout import BuildLayout
from mixing.stage import Stage, begin, publish
from mixing.stages import STAGES

NAMES = [s.name for s in STAGES]


def mix_with(sources: list[str]) -> Mix:
    text = (
        "name: m\nsequence: {length: 64, global_batch: 1}\nsources:\n"
        + "".join(f"  '{n}': {{uri: x}}\n" for n in sources)  # quoted: YAML reads a bare `no` as false
        + f"curriculum:\n  - {{phase: p, steps: 1, mixture: {{'{sources[0]}': 1}}}}\n"
    )
    return parse_mix(text)


@settings(max_examples=30)
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


@settings(max_examples=16)
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


@pytest.mark.parametrize("elsewhere", [False, True])
@pytest.mark.parametrize("partition", [None, "qa"])
def test_begin_withdraws_the_record_and_publish_writes_one_listing_the_files(
    tmp_path: Path, elsewhere: bool, partition: str | None
) -> None:
    layout = BuildLayout(tmp_path / "work", str(tmp_path / "root") if elsewhere else None)
    begin(layout, "plan", partition)
    assert layout.root.is_dir() and read_commit(layout.store(), "plan", partition) is None
    (layout.root / "plan").mkdir()
    (layout.root / "plan" / "a.parquet").write_bytes(b"abc")
    worker = {"name": "shards/x.bin", "bytes": 2, "sha256": "0" * 64}
    publish(layout, "plan", partition, ["plan/a.parquet"], [worker])
    record = read_commit(layout.store(), "plan", partition)
    assert record is not None
    assert record.files == {
        "shards/x.bin": (2, "0" * 64),
        "plan/a.parquet": (3, sha256_file(layout.root / "plan" / "a.parquet")),
    }
    if elsewhere:  # copied to the build root, where the record is
        assert (tmp_path / "root" / "plan" / "a.parquet").read_bytes() == b"abc"
    assert verify(layout.store(), record) == ["shards/x.bin: missing"], "the worker's entry is listed as given"

    begin(layout, "plan", partition)
    assert read_commit(layout.store(), "plan", partition) is None, "withdrawn before the outputs change"
