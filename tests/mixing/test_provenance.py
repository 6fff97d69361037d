"""``mixing.provenance`` and the commands that print it (``weir lookup``, ``weir epochs``).

One small build reads every input format weir reads (jsonl with a template and a malformed line, parquet, csv
with a template and a value across two lines, text cut by a separator, a code ``.tar`` with a member it skips),
with a trained BPE and the loader's regrouping on, built in this process (about a second). Its lookups are
checked against what each record renders to, written out here without weir's readers, against the shards' own
segments, and (``weir lookup --rank --dp --cp``) against the items a :class:`loaders.PackedDataset` of that
world hands out; its epochs against a count of the shards' segments.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from contract.shards import ShardSet
from mixing import load_mix
from mixing.output.layout import BuildLayout
from mixing.piece import Piece
from mixing.provenance import Provenance, ProvenanceError, step_range
from mixing.stages import STAGES
from pipelines.cli import app

S, BATCH, STEPS = 64, 4, 8
LABEL = {  # what each format's ``line`` reads as
    "qa": r"line \d+",
    "rows": r"row \d+",
    "table": r"row \d+",
    "notes": r"piece \d+",
    "code": r"member \d+ \(pkg/m\d\.py\)",
}


@dataclass(frozen=True)
class Formats:
    """The build's root and, per (source, line), the record's text as its source renders it."""

    root: Path
    rendered: dict[tuple[str, int], str]


def write_formats(data: Path) -> dict[tuple[str, int], str]:
    """One file per format under ``data``; returns every kept record's rendered text by (source, line)."""
    data.mkdir(parents=True)
    rendered: dict[tuple[str, int], str] = {}
    lines = [json.dumps({"q": f"what is {i}+{i}?", "a": str(2 * i)}) for i in range(30)]
    lines.insert(5, "{not json")  # quarantined: the records after it keep their own line numbers
    (data / "qa.jsonl").write_text("\n".join(lines) + "\n")
    for n, line in enumerate(lines, start=1):
        if line.startswith('{"q"'):
            rec = json.loads(line)
            rendered["qa", n] = f"Q: {rec['q']} A: {rec['a']}"
    texts = [f"row {i}: " + " ".join(f"w{(i * 5 + k) % 17}" for k in range(3 + i)) for i in range(20)]
    pq.write_table(pa.table({"text": texts}), data / "rows.parquet")
    rendered |= {("rows", i + 1): t for i, t in enumerate(texts)}
    bodies = [f"body {i} é, {'x' * i}" if i != 3 else "body 3\nacross two lines" for i in range(20)]
    (data / "t.csv").write_text("title,body\n" + "".join(f't{i},"{b}"\n' for i, b in enumerate(bodies)))
    rendered |= {("table", i + 1): f"t{i}: {b}" for i, b in enumerate(bodies)}  # a row, not a line
    pieces = [f"note {i}: " + "abc " * (i * 3) + "end" for i in range(15)]
    (data / "notes.txt").write_text("\n\n".join(pieces))
    rendered |= {("notes", i + 1): p for i, p in enumerate(pieces)}
    with tarfile.open(data / "code.tar", "w") as tar:
        members = [("pkg/README.txt", "not code: skipped, but it is member 1")]
        members += [(f"pkg/m{i}.py", f"def f{i}(x):\n    return x * {i}\n" * (i + 1)) for i in range(8)]
        for n, (name, body) in enumerate(members, start=1):
            info = tarfile.TarInfo(name)
            info.size = len(body.encode())
            tar.addfile(info, io.BytesIO(body.encode()))
            if name.endswith(".py"):
                rendered["code", n] = body
    return rendered


FORMATS_MIX = """\
name: formats
seed: 3
tokenizer: {{kind: bpe, vocab_size: 300}}
sequence: {{length: {S}, global_batch: {BATCH}}}
sources:
  qa:    {{uri: "{data}/qa.jsonl", format: jsonl, template: "Q: {{q}} A: {{a}}", max_epochs: 50}}
  rows:  {{uri: "{data}/rows.parquet", format: parquet, max_epochs: 50}}
  table: {{uri: "{data}/t.csv", format: csv, template: "{{title}}: {{body}}", max_epochs: 50}}
  notes: {{uri: "{data}/notes.txt", format: text, separator: "\\n\\n", max_epochs: 50}}
  code:  {{uri: "{data}/code.tar", format: code, max_epochs: 50}}
curriculum:
  - {{phase: one, steps: {STEPS}, mixture: {{qa: 0.2, rows: 0.2, table: 0.2, notes: 0.2, code: 0.2}}}}
balance: {{regroup: {{window: 4, period: 2, slack: 1.15}}}}
"""


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> Formats:
    base = tmp_path_factory.mktemp("formats")
    rendered = write_formats(base / "data")
    (base / "formats.yaml").write_text(FORMATS_MIX.format(S=S, BATCH=BATCH, STEPS=STEPS, data=base / "data"))
    mix, layout = load_mix(base / "formats.yaml"), BuildLayout(base / "build")
    for stage in STAGES:
        for part in stage.partitions(mix):
            stage.run(mix, layout, part)
    return Formats(layout.root, rendered)


def weir(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


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


# --- the commands -------------------------------------------------------------------------------------------


def test_lookup_of_a_rank_is_what_the_loader_hands_that_rank(formats: Formats, tmp_path: Path) -> None:
    """``weir lookup --rank R --dp 2 --cp 2 --cp-rank K``: the sequences of the training step (regrouped: not the
    build step's) that DP rank R's loader reads, in its order, each document's held ranges the slots the loader
    cut for CP rank K (zigzag)."""
    from loaders import Payload, Reading, World
    from loaders.dataset import PackedDataset

    fields = ("input_ids", "labels", "indices", "cu_seqlens", "seg_source", "seg_doc", "seg_offset")
    regrouped = False
    for rank, cp_rank in [(0, 1), (1, 0)]:
        world = World(dp_rank=rank, dp_size=2, cp_rank=cp_rank, cp_size=2)
        ds = PackedDataset(
            formats.root, world=world, payload=Payload(fields=fields), reading=Reading(cache_dir=tmp_path)
        )
        items: dict[int, list[dict[str, object]]] = {}
        for item in ds:
            items.setdefault(int(item["step"]), []).append(item)
        for step in (1, 6):
            code, stdout, stderr = weir(
                "lookup", str(formats.root), "--step", str(step), "--rank", str(rank), "--dp", "2",
                "--cp", "2", "--cp-rank", str(cp_rank), "--json",
            )  # fmt: skip
            assert code == 0, stderr
            got = json.loads(stdout)
            assert got["dp"] == {"rank": rank, "size": 2} and got["cp"] == {
                "rank": cp_rank,
                "size": 2,
                "split": "zigzag",
            }
            assert got["sequences"] == [it["sequence"] for it in items[step]]
            regrouped |= any(s["build_step"] != step for s in got["segments"])
            want = []
            for it in items[step]:
                cu = it["cu_seqlens"].numpy()  # type: ignore[attr-defined]
                idx = it["indices"].numpy()  # type: ignore[attr-defined]
                for j, doc in enumerate(it["seg_doc"].tolist()):  # type: ignore[attr-defined]
                    if doc < 0:  # the trailing padding
                        continue
                    mine = np.sort(idx[(idx >= cu[j]) & (idx < cu[j + 1])]) - cu[j] + int(it["seg_offset"][j])  # type: ignore[index]
                    want.append((it["sequence"], doc, mine.tolist()))
            held = [
                (s["sequence"], s["doc_id"], [t for a, b in s["held"] for t in range(a, b)]) for s in got["segments"]
            ]
            assert held == want
    assert regrouped, "a training step here gathers sequences of other build steps"


def test_lookup_thd_holds_chunks_r_and_2cp_minus_1_minus_r_of_every_document(formats: Formats) -> None:
    code, stdout, stderr = weir(
        "lookup", str(formats.root), "--step", "0", "--cp", "2", "--cp-rank", "1", "--cp-split", "thd", "--json"
    )
    assert code == 0, stderr
    for s in json.loads(stdout)["segments"]:
        m = -(-s["length"] // 4)  # each document padded at its end to a multiple of 2·cp, in 4 chunks of m
        chunks = [(s["start"] + c * m, min(s["start"] + (c + 1) * m, s["end"])) for c in (1, 2)]
        merged = [c for c in chunks if c[0] < c[1]]
        if len(merged) == 2 and merged[0][1] == merged[1][0]:
            merged = [(merged[0][0], merged[1][1])]
        assert [tuple(r) for r in s["held"]] == merged, s


def test_lookup_contiguous_holds_a_slice_of_every_sequence(formats: Formats) -> None:
    code, stdout, stderr = weir(
        "lookup", str(formats.root), "--step", "0", "--cp", "2", "--cp-split", "contiguous", "--json"
    )
    assert code == 0, stderr
    for s in json.loads(stdout)["segments"]:  # CP rank 0: slots 0 … S/2 − 1, in document coordinates
        a, b = s["position"], min(s["position"] + s["length"], S // 2)
        assert s["held"] == ([[s["start"], s["start"] + b - a]] if a < b else []), s


def test_lookup_prints_one_line_per_segment_and_its_text(formats: Formats) -> None:
    code, stdout, stderr = weir("lookup", str(formats.root), "--step", "2", "--text")
    assert code == 0, stderr
    lines = stdout.splitlines()
    assert re.fullmatch(r"training step 2: 4 sequences, \d+ segments, [\d,]+ tokens", lines[0])
    sequences = json.loads(weir("lookup", str(formats.root), "--step", "2", "--json")[1])["sequences"]
    for p in Provenance(formats.root).lookup(sequences, text=True):
        at = lines.index(f"  {p.source}  {p.file}  {p.record}  tokens {p.start}:{p.end} of {p.n_tokens} ({p.length})")
        assert lines[at + 1] == "    " + json.dumps(p.text, ensure_ascii=False)


def test_epochs_prints_the_counts_of_the_steps_asked(formats: Formats) -> None:
    code, stdout, stderr = weir("epochs", str(formats.root), "--steps", "2:5", "--json")
    assert code == 0, stderr
    assert json.loads(stdout) == Provenance(formats.root).epochs(2, 5).as_json()
    code, stdout, stderr = weir("epochs", str(formats.root))
    assert code == 0, stderr
    assert "build steps 0..7" in stdout and all(name in stdout for name in LABEL)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["lookup", "{root}", "--step", "8"], "has no step 8: its steps are 0..7"),
        (["lookup", "{missing}", "--step", "0"], "no manifest.json.*give the folder weir build wrote"),
        (["lookup", "{root}", "--step", "0", "--dp", "2"], "add --rank R"),
        (["lookup", "{root}", "--step", "0", "--rank", "0", "--dp", "3"], "not divisible by dp_size 3.*--dp"),
        (["lookup", "{root}", "--step", "0", "--cp", "3", "--cp-split", "thd"], "2·cp_size 6.*--cp"),
        (["lookup", "{root}", "--step", "0", "--cp-rank", "1"], "needs --cp C"),
        (["lookup", "{root}", "--step", "0", "--cp", "2", "--cp-rank", "2"], "rank out of range.*--cp"),
        (["epochs", "{root}", "--steps", "3:2"], "give A:B"),
        (["epochs", "{missing}"], "no manifest.json"),
    ],
)
def test_a_failure_is_one_line_and_exit_1(formats: Formats, tmp_path: Path, args: list[str], says: str) -> None:
    code, stdout, stderr = weir(*(a.format(root=formats.root, missing=tmp_path / "nope") for a in args))
    assert code == 1 and stdout == ""
    assert len(stderr.strip().splitlines()) == 1 and re.search(says, stderr), stderr


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
