"""``mixing.piece``: a looked-up segment and its form for machines (``weir lookup --json``)."""

from __future__ import annotations

from dataclasses import replace

from mixing.piece import Piece

PIECE = Piece(
    sequence=9, step=2, position=40, source="qa", doc_id=7, file="/d/a.jsonl", line=3, record="line 3",
    start=16, length=24, n_tokens=50,
)  # fmt: skip


def test_a_piece_ends_one_past_its_last_token() -> None:
    assert PIECE.end == 40


def test_as_json_names_every_field_and_the_optional_ones_only_when_set() -> None:
    assert PIECE.as_json() == {
        "sequence": 9,
        "build_step": 2,
        "position": 40,
        "source": "qa",
        "doc_id": 7,
        "file": "/d/a.jsonl",
        "line": 3,
        "record": "line 3",
        "start": 16,
        "end": 40,
        "length": 24,
        "n_tokens": 50,
    }
    full = replace(PIECE, meta='{"k": 1}', held=((16, 20), (30, 40)), text="hé").as_json()
    assert (full["meta"], full["held"], full["text"]) == ('{"k": 1}', [[16, 20], [30, 40]], "hé")
    assert replace(PIECE, held=()).as_json()["held"] == []  # a CP rank holding none of it still says so
