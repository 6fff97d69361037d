"""The commands that print ``mixing.provenance`` (``weir lookup``, ``weir epochs``), run in this process on a
small build of every input format (:mod:`tests.mixing.provenance_helpers`): a rank's lookup (``--rank --dp --cp``)
against the items a :class:`loaders.PackedDataset` of that world hands out, the CP splits' held ranges, the
lines printed, and every failure one line and exit code 1."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from mixing.provenance import Provenance
from tests.mixing.provenance_helpers import LABEL, Formats, S, build_formats, weir


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> Formats:
    """The build of every format, once for this module."""
    return build_formats(tmp_path_factory.mktemp("formats"))


def test_lookup_of_a_rank_is_what_the_loader_hands_that_rank(formats: Formats, tmp_path: Path) -> None:
    """``weir lookup --rank R --dp 2 --cp 2 --cp-rank K``: the sequences of the training step (regrouped: not the
    build step's) that DP rank R's loader reads, in its order, each document's held ranges the slots the loader
    cut for CP rank K (zigzag)."""
    from loaders import Payload, Reading, World
    from loaders.dataset import PackedDataset

    fields = ("input_ids", "labels", "indices", "cu_seqlens", "segments")
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
                for j, (_source, doc, offset) in enumerate(it["segments"].tolist()):  # type: ignore[attr-defined]
                    if doc < 0:  # the trailing padding
                        continue
                    mine = np.sort(idx[(idx >= cu[j]) & (idx < cu[j + 1])]) - cu[j] + offset
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
