"""``mixing.report``: a build's figures (:class:`BuildReport`) recomputed by ``inspect_build`` agree with the
shards' own arrays, the manifest's records and the documents; the figures the build saved (``report.json``) are
what ``inspect_build`` recomputes; damage is reported (a shard file that differs from its checksum is named in
``corrupt_files``; a DuckDB file that does not fit the shards is one :class:`BuildError` line, and a damaged
shard file is named as the cause when both are wrong); ``saved_report`` hands back what ``write_report`` saved,
and nothing once the file is edited or the manifest is another.

``weir inspect`` on every kind of damage (exit 1, one line): tests/faults/test_inspect_damage.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.manifest import MANIFEST, ShardError, seal
from contract.shards import ShardSet
from mixing import load_mix
from mixing.output.layout import BuildLayout
from mixing.report import (
    REPORT,
    BuildError,
    BuildReport,
    build_mixture_error,
    inspect_build,
    saved_report,
    write_report,
)
from mixing.stages import STAGES
from tests.conftest import TINY_MIX, write_tiny_sources

TOKENS = "shard-00000.tokens.npy"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny mix built by running :data:`STAGES` in order (no ``report.json``: the asset writes that)."""
    base = tmp_path_factory.mktemp("tiny")
    write_tiny_sources(base / "data")
    (base / "tiny.yaml").write_text(TINY_MIX.format(root=base / "data"))
    mix, layout = load_mix(base / "tiny.yaml"), BuildLayout(base / "build")
    for s in STAGES:
        for part in s.partitions(mix):
            s.run(mix, layout, part)
    return layout.root


@pytest.fixture
def copy(tiny: Path, tmp_path: Path) -> Path:
    shutil.copytree(tiny, tmp_path / "b")
    return tmp_path / "b"


def check_figures(root: Path) -> BuildReport:
    """``inspect_build(root)``, each figure checked against the shards' arrays, the manifest and docs.parquet."""
    r = inspect_build(root)
    layout = BuildLayout(root)
    m = ShardSet(layout.shards_dir).manifest
    assert m.per_source is not None and m.sources is not None
    assert (r.mix, r.format_version, r.dtype, r.seq_len, r.global_batch) == (
        m.mix,
        m.format_version,
        m.dtype,
        m.seq_len,
        m.global_batch,
    )
    assert r.shards == len(m.shards) and r.phases == m.phases and r.steps == m.steps
    assert r.sequences == m.sequences == m.steps * m.global_batch  # type: ignore[operator]

    arrays: dict[str, list[np.ndarray]] = {"seq_tokens": [], "seq_cost": [], "counts": [], "segments": []}
    for shard in m.shards:
        with np.load(layout.shards_dir / shard.files.meta.name) as z:
            arrays["seq_tokens"].append(z["seq_tokens"])
            arrays["seq_cost"].append(z["seq_cost"])
            arrays["counts"].append(np.diff(z["seg_offsets"]))
            arrays["segments"].append(z["segments"])
    seq_tokens, cost, counts, segs = (np.concatenate(v) for v in arrays.values())
    assert r.tokens == int(seq_tokens.sum()) == int(segs[:, 3].sum())
    assert r.packing_efficiency == pytest.approx(r.tokens / (r.sequences * r.seq_len))
    assert (r.segments_per_sequence.mean, r.segments_per_sequence.max) == (
        pytest.approx(counts.mean()),
        int(counts.max()),
    )
    c = r.sequence_cost
    assert c.mean == pytest.approx(cost.mean()) and c.max_over_mean == pytest.approx(cost.max() / cost.mean())
    assert c.p95_over_mean == pytest.approx(np.percentile(cost, 95) / cost.mean())
    assert c.cv == pytest.approx(cost.std() / cost.mean())
    assert 0 <= r.truncated_docs <= 1

    assert list(r.per_source) == list(m.sources)
    assert sum(s.tokens_packed for s in r.per_source.values()) == r.tokens
    assert r.tokens_dropped == sum(s.tokens_dropped for s in r.per_source.values())
    for name, s in r.per_source.items():
        recorded = m.per_source[name]
        assert (s.tokens_packed, s.documents_packed) == (recorded.tokens_packed, recorded.documents_packed), name
        assert s.tokens_planned == s.tokens_packed + s.tokens_dropped, name
        docs = pl.read_parquet(layout.source_dir(name) / "docs.parquet", columns=["n_tokens"])
        assert (s.documents_indexed, s.tokens_indexed) == (len(docs), int(docs["n_tokens"].sum())), name
        assert s.truncated_docs <= s.documents_packed <= s.documents_indexed, name
    assert r.mixture_error == build_mixture_error(root).report()
    assert r.corrupt_files == () and r.file_problems == {} and r.manifest_sealed
    assert BuildReport.model_validate(json.loads(json.dumps(r.as_json()))) == r
    assert "mixture_error_stream" not in r.as_json(), "None fields are left out"
    return r


def test_the_figures_of_the_tiny_build_agree_with_its_shards_manifest_and_documents(tiny: Path) -> None:
    r = check_figures(tiny)
    # the tokens pinned: the plan fitted to its packing (its first phase's whole documents deferred to the next)
    assert (r.sequences, r.tokens, r.truncated_docs) == (32, 1735, 0.0)


def test_the_figures_the_demo_build_saved_are_what_inspect_recomputes(demo_build: Path) -> None:
    r = check_figures(demo_build)
    assert saved_report(demo_build) == r
    saved = json.loads((demo_build / REPORT).read_text())
    assert saved["report"] == json.loads(json.dumps(r.as_json()))


def test_a_shard_file_that_differs_from_its_checksum_is_reported_with_the_other_figures(tiny: Path, copy: Path) -> None:
    p = copy / "shards" / TOKENS
    data = bytearray(p.read_bytes())
    data[-3] ^= 1  # a token of the last sequence: the file still reads
    p.write_bytes(bytes(data))
    r = inspect_build(copy)
    assert r.corrupt_files == (TOKENS,)
    assert list(r.file_problems) == [TOKENS] and "sha256" in r.file_problems[TOKENS]
    sound = inspect_build(tiny)
    assert r.model_copy(update={"corrupt_files": (), "file_problems": {}}) == sound


def delete_duckdb(root: Path) -> None:
    (root / "weir.duckdb").unlink()


def on_duckdb(sql: str) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        with duckdb.connect(str(root / "weir.duckdb")) as con:
            con.execute(sql)

    return damage


DUCKDB_DAMAGE: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "missing": (delete_duckdb, ["weir.duckdb", "missing", "rebuild"]),
    "a shorter plan": (
        on_duckdb("DELETE FROM plan_quotas WHERE step >= 4"),
        ["weir.duckdb", "does not match", MANIFEST],
    ),
    "a source not planned": (on_duckdb("DELETE FROM plan_quotas WHERE source = 'qa'"), ["does not match", "qa"]),
    "fewer documents": (
        on_duckdb("DELETE FROM documents WHERE source = 'qa' AND doc_id >= 5"),
        ["weir.duckdb", "documents of 'qa' do not match"],
    ),
}


@pytest.mark.parametrize("kind", sorted(DUCKDB_DAMAGE))
def test_a_duckdb_file_that_does_not_fit_the_shards_is_one_build_error_line(copy: Path, kind: str) -> None:
    damage, words = DUCKDB_DAMAGE[kind]
    damage(copy)
    with pytest.raises(BuildError) as e:
        inspect_build(copy)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and all(w in msg for w in words), msg


def test_a_damaged_shard_file_is_named_as_the_cause_of_what_it_broke(copy: Path) -> None:
    p = copy / "shards" / TOKENS
    data = bytearray(p.read_bytes())
    data[-3] ^= 1
    p.write_bytes(bytes(data))
    delete_duckdb(copy)
    with pytest.raises(ShardError) as e:
        inspect_build(copy)
    msg = str(e.value)
    assert len(msg.splitlines()) == 1 and TOKENS in msg and "sha256" in msg and "weir.duckdb" not in msg, msg


def leaves(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths to every number and string in a JSON value."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in leaves(v, (*path, k))]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in leaves(v, (*path, i))]
    return [path] if isinstance(obj, int | float | str) and not isinstance(obj, bool) else []


def test_saved_figures_come_back_until_the_file_or_the_manifest_changes(copy: Path) -> None:
    assert saved_report(copy) is None, "no report.json yet"
    r = inspect_build(copy)
    write_report(copy, r)
    assert saved_report(copy) == r
    saved = (copy / REPORT).read_text()

    for garbage in ("", "{", "[]", '{"report": 1}', saved.replace('"report"', '"figures"')):
        (copy / REPORT).write_text(garbage)
        assert saved_report(copy) is None, garbage
    (copy / REPORT).write_text(saved)

    p = copy / "shards" / MANIFEST
    m = json.loads(p.read_text())
    m["seed"] = m["seed"] + 1  # another manifest, consistent with its own checksum
    p.write_text(json.dumps(seal(m), indent=2, sort_keys=True) + "\n")
    assert saved_report(copy) is None, "figures of other shards"


@pytest.fixture(scope="module")
def reported(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A copy of the tiny build with its figures saved, and the text of the ``report.json`` saved."""
    root = tmp_path_factory.mktemp("reported") / "b"
    shutil.copytree(tiny, root)
    write_report(root, inspect_build(root))
    assert saved_report(root) is not None
    return root, (root / REPORT).read_text()


@settings(max_examples=30)
@given(data=st.data())
def test_any_edit_to_the_saved_figures_is_refused(reported: tuple[Path, str], data: st.DataObject) -> None:
    root, text = reported
    saved = json.loads(text)
    path = data.draw(st.sampled_from(leaves(saved)))
    *parent, key = path
    holder = saved
    for k in parent:
        holder = holder[k]
    old = holder[key]
    holder[key] = old + "0" if isinstance(old, str) else old + data.draw(st.sampled_from([1, -1, 0.5]))
    (root / REPORT).write_text(json.dumps(saved))
    assert saved_report(root) is None, path
