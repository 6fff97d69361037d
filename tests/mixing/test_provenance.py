"""``mixing.provenance``: the pieces of a build's steps and its epochs, looked up in a small build of every input
format (:mod:`tests.mixing.provenance_helpers`).

Its lookups are checked against what each record renders to, written out without weir's readers, and against
the shards' own segments; its epochs against a count of the shards' segments. A source's index written otherwise
looks up the same; one gone or of another tokenizer, and a tokenizer that cannot be loaded, are refused in one
line.
The commands that print it (``weir lookup``, ``weir epochs``) are tested in ``test_provenance_commands.py``.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from contract.shards import ShardSet
from mixing.piece import Piece
from mixing.provenance import Provenance, ProvenanceError, step_range
from tests.mixing.provenance_helpers import LABEL, STEPS, Formats, S, build_formats, weir


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> Formats:
    """The build of every format, once for this module."""
    return build_formats(tmp_path_factory.mktemp("formats"))


# --- the pieces of a step -----------------------------------------------------------------------------------


def test_every_format_decodes_to_its_record_as_rendered(formats: Formats) -> None:
    """Every piece of every step decoded: a whole document is its record as rendered (template applied, BOS/EOS
    left out), a split one is its pieces back to back; each format's record reads as its own (line, row, ...)."""
    prov = Provenance(formats.root)
    shards = ShardSet(formats.root / "shards")
    whole: dict[str, int] = {}
    parts: dict[tuple[str, int], list[Piece]] = {}
    for step in range(prov.steps):
        seqs = prov.step_sequences(step)
        pieces = prov.lookup(seqs, text=True)
        segments = np.concatenate([shards.sequence(int(i)).segments for i in seqs])
        got = [(prov.sources.index(p.source), p.doc_id, p.start, p.length) for p in pieces]
        assert got == [tuple(s) for s in segments.tolist()], "one piece per segment, in the shards' order"
        for p in pieces:
            assert p.step == step and re.fullmatch(LABEL[p.source], p.record), p
            assert p.text is not None and p.end <= p.n_tokens
            if p.length == p.n_tokens:
                assert p.text == formats.rendered[p.source, p.line], p
                whole[p.source] = whole.get(p.source, 0) + 1
            else:
                parts.setdefault((p.source, p.line), []).append(p)
    assert set(whole) == set(LABEL), f"a whole document of every format: {whole}"
    joined = 0
    for (source, line), split in parts.items():
        runs = sorted({(p.start, p.end): p for p in split}.values(), key=lambda p: p.start)
        if [p.start for p in runs] == [0, *(p.end for p in runs[:-1])] and runs[-1].end == runs[-1].n_tokens:
            assert "".join(p.text or "" for p in runs) == formats.rendered[source, line]
            joined += 1
    assert joined, "some document longer than S was read whole, piece by piece"


def test_a_piece_names_its_document_as_the_index_does(formats: Formats) -> None:
    prov = Provenance(formats.root)
    pieces = prov.lookup(prov.step_sequences(3))
    for p in pieces:
        docs = pl.read_parquet(formats.root / "sources" / p.source / "docs.parquet")
        row = docs.row(p.doc_id, named=True)
        assert (row["doc_id"], row["file"], row["line"], row["n_tokens"]) == (p.doc_id, p.file, p.line, p.n_tokens)
        assert p.text is None and p.held is None and "text" not in p.as_json()
    by_seq = [p for p in pieces if p.sequence == pieces[0].sequence]
    assert [p.position for p in by_seq] == [0, *np.cumsum([p.length for p in by_seq])[:-1].tolist()]


def runs(values: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct integers as ranges [a, b) of consecutive ones."""
    out: list[tuple[int, int]] = []
    for v in values:
        if out and out[-1][1] == v:
            out[-1] = (out[-1][0], v + 1)
        else:
            out.append((v, v + 1))
    return out


def test_held_ranges_are_the_slots_in_document_coordinates(formats: Formats) -> None:
    prov = Provenance(formats.root)
    seqs = prov.step_sequences(0)
    every = prov.lookup(seqs, slots=lambda lengths: np.arange(int(lengths.sum()))[::-1].copy())
    assert all(p.held == ((p.start, p.end),) for p in every), "all slots, in any order: each piece whole"
    slots = np.r_[np.arange(S // 2), -1, S - 1, S - 3]  # -1: a CP padding slot
    for p in prov.lookup(seqs, slots=lambda lengths: slots):
        mine = sorted(p.start + x - p.position for x in slots.tolist() if p.position <= x < p.position + p.length)
        assert list(p.held or ()) == runs(mine), p


# --- epochs -------------------------------------------------------------------------------------------------


def test_epochs_count_each_piece_once_and_every_token_seen(formats: Formats) -> None:
    prov = Provenance(formats.root)
    shards = ShardSet(formats.root / "shards")
    _, segs = shards.segments
    per_step = len(shards) // STEPS
    owner_step = np.repeat(np.arange(len(shards)) // per_step, np.diff(shards.segments[0]))
    for first, stop in [(0, STEPS), (2, 5)]:
        report = prov.epochs(first, stop)
        assert (report.first, report.stop) == (first, stop)
        mine = segs[(owner_step >= first) & (owner_step < stop)]
        for k, s in enumerate(report.sources):
            assert s.source == shards.manifest.sources[k]  # type: ignore[index]
            src = mine[mine[:, 0] == k]
            pieces = {(d, a): n for _, d, a, n in src.tolist()}
            total = int(pl.read_parquet(formats.root / "sources" / s.source / "docs.parquet")["n_tokens"].sum())
            assert (s.tokens, s.tokens_seen, s.unique_tokens) == (total, int(src[:, 3].sum()), sum(pieces.values()))
            assert s.repeated_tokens == s.tokens_seen - s.unique_tokens >= 0
            assert s.epochs == pytest.approx(s.tokens_seen / total)
    table = {s.source: s for s in prov.epochs().sources}["table"]
    assert table.epochs > 1 and table.repeated_tokens > 0 and table.unique_tokens <= table.tokens


@pytest.mark.parametrize(
    ("text", "span"), [(None, (0, 8)), ("2:5", (2, 5)), (":3", (0, 3)), ("6:", (6, 8)), (" 1 : 2 ", (1, 2))]
)
def test_a_step_range_reads_as_build_steps(text: str | None, span: tuple[int, int]) -> None:
    assert step_range(text, 8) == span


@pytest.mark.parametrize("text", ["5:3", "0:9", "4:4", "a:b", "3", "-1:2"])
def test_a_step_range_outside_the_build_is_refused(text: str) -> None:
    with pytest.raises(ProvenanceError, match="A:B"):
        step_range(text, 8)


# --- a build's files gone, rewritten or not fitting ---------------------------------------------------------


def test_a_source_index_gone_or_from_another_build_is_named(formats: Formats, tmp_path: Path) -> None:
    prov = Provenance(formats.root)
    step = next(t for t in range(STEPS) if any(p.source == "qa" for p in prov.lookup(prov.step_sequences(t))))
    copy = tmp_path / "b"
    shutil.copytree(formats.root, copy, ignore=shutil.ignore_patterns("chunks", "weir.duckdb"))
    docs = copy / "sources" / "qa" / "docs.parquet"
    table = pq.read_table(docs)
    docs.unlink()
    for args in (["lookup", str(copy), "--step", str(step)], ["epochs", str(copy)]):
        code, _, stderr = weir(*args)
        assert code == 1 and len(stderr.strip().splitlines()) == 1, stderr
        assert f"{docs}: missing" in stderr and f"weir build MIX --out {copy}" in stderr, stderr
    tokenizer = pa.array(["x" * 64] * len(table))
    pq.write_table(table.set_column(table.schema.get_field_index("tokenizer"), "tokenizer", tokenizer), docs)
    with pytest.raises(ProvenanceError, match="another tokenizer"):
        Provenance(copy).epochs()


def test_an_index_written_otherwise_looks_up_the_same(formats: Formats, tmp_path: Path) -> None:
    """Every source's index rewritten in row groups of 3 rows, its integers delta-encoded and nothing as a
    dictionary: every step's pieces are the same (the first and last row groups of each source read too)."""
    copy = tmp_path / "b"
    shutil.copytree(formats.root, copy, ignore=shutil.ignore_patterns("chunks", "weir.duckdb"))
    for docs in (copy / "sources").glob("*/docs.parquet"):
        table = pq.read_table(docs)
        ints = ("doc_id", "line", "n_tokens", "offset")
        pq.write_table(
            table,
            docs,
            row_group_size=3,
            use_dictionary=False,
            column_encoding=dict.fromkeys(ints, "DELTA_BINARY_PACKED"),
            compression="none",
        )
    a, b = Provenance(formats.root), Provenance(copy)
    for step in range(STEPS):
        assert b.lookup(b.step_sequences(step), text=True) == a.lookup(a.step_sequences(step), text=True)
    for k, name in enumerate(a.sources):
        n = pq.ParquetFile(copy / "sources" / name / "docs.parquet").metadata.num_rows
        assert b._documents(k, [0, n - 1]) == a._documents(k, [0, n - 1])


def test_a_lookup_reading_a_group_of_another_tokenizer_is_refused(formats: Formats, tmp_path: Path) -> None:
    prov = Provenance(formats.root)
    pieces = prov.lookup(prov.step_sequences(0))
    copy = tmp_path / "b"
    shutil.copytree(formats.root, copy, ignore=shutil.ignore_patterns("chunks", "weir.duckdb"))
    docs = copy / "sources" / pieces[0].source / "docs.parquet"
    table = pq.read_table(docs)
    tokenizer = pa.array(["x" * 64] * len(table))
    pq.write_table(table.set_column(table.schema.get_field_index("tokenizer"), "tokenizer", tokenizer), docs)
    with pytest.raises(ProvenanceError, match=f"{docs} does not fit the shards.*another tokenizer"):
        Provenance(copy).lookup(prov.step_sequences(0))


def test_a_tokenizer_that_cannot_be_loaded_is_a_provenance_error(formats: Formats, tmp_path: Path) -> None:
    prov = Provenance(formats.root)
    copy = tmp_path / "b"
    shutil.copytree(formats.root, copy, ignore=shutil.ignore_patterns("chunks", "weir.duckdb"))
    (copy / "tokenizer" / "tokenizer.json").write_text("{not json")
    with pytest.raises(ProvenanceError, match=r"tokenizer\.json: cannot load it .*build the mix again") as e:
        Provenance(copy).lookup(prov.step_sequences(0), text=True)
    assert len(str(e.value).splitlines()) == 1
