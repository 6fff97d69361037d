"""``mixing.epochs``: per source, tokens seen, unique, repeated and epochs, counted from a span's segments.

The counts of a real build's steps against its shards are checked through ``Provenance.epochs`` in
``test_provenance.py``; here, a few hand-made segments whose counts are written out.
"""

from __future__ import annotations

import numpy as np
import pytest

from mixing.epochs import EpochsReport, SourceEpochs, count_epochs

SEGS = np.array(
    [  # (source, doc_id, start, length)
        [0, 4, 0, 10],
        [1, 0, 0, 6],
        [0, 4, 10, 5],  # the rest of document 4: another piece
        [0, 4, 0, 10],  # document 4's first piece again: a repeat
        [1, 2, 3, 4],
    ],
    dtype=np.int64,
)


def test_a_piece_counts_once_however_often_it_is_drawn() -> None:
    asked: list[int] = []

    def tokens(k: int) -> int:
        asked.append(k)
        return (20, 0, 7)[k]

    report = count_epochs(SEGS, 2, 5, ("a", "b", "c"), tokens)
    assert asked == [0, 1, 2], "each source's tokens asked once, in order"
    assert (report.first, report.stop) == (2, 5)
    a, b, c = report.sources
    assert a == SourceEpochs("a", 20, 25, 15) and (a.repeated_tokens, a.epochs) == (10, 1.25)
    assert b == SourceEpochs("b", 0, 10, 10) and b.epochs == 0.0  # a source without tokens
    assert c == SourceEpochs("c", 7, 0, 0) and (c.repeated_tokens, c.epochs) == (0, 0.0)


def test_the_report_for_machines() -> None:
    report = EpochsReport(0, 3, (SourceEpochs("a", 8, 12, 8),))
    assert report.as_json() == {
        "steps": [0, 3],
        "sources": {
            "a": {
                "tokens": 8,
                "tokens_seen": 12,
                "unique_tokens": 8,
                "repeated_tokens": 4,
                "epochs": pytest.approx(1.5),
            }
        },
    }
    assert EpochsReport(0, 1).sources == ()
