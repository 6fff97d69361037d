"""A piece: one segment of a packed sequence named by its document, as ``weir lookup`` prints it.

:meth:`mixing.provenance.Provenance.lookup` makes one :class:`Piece` per segment of the sequences asked for:
where it sits (sequence, build step, first slot), which document it is of (source, ``doc_id``, the file and
record its source's ``docs.parquet`` names; ``record`` as :func:`mixing.record_labels.record_label` reads the
record's number) and which of the document's tokens it holds (``start`` … ``end − 1`` of ``n_tokens``); with a
CP rank's slots, the ranges of them that rank holds; when asked, its text. :meth:`Piece.as_json` is its form in
``weir lookup --json``. Frozen: a lookup adds a piece's text by :func:`dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Piece"]


@dataclass(frozen=True)
class Piece:
    """One segment of a sequence: tokens ``start … end − 1`` of document ``doc_id`` of ``source``.

    ``sequence`` (global index in the build), ``step`` (its build step), ``position`` (its first slot in the
    sequence); ``file`` and ``line`` from the source's index, ``record`` as
    :func:`~mixing.record_labels.record_label` reads them, ``n_tokens`` (the whole document's, EOS included),
    ``meta`` (the kept metadata JSON, or None). ``held``: with a CP rank's slots, the token ranges ``(a, b)`` of
    the document (same coordinates as ``start``) that rank holds, in order (empty: none of it); None without.
    ``text``: when asked, the piece's tokens decoded (see :mod:`mixing.provenance`), else None.
    """

    sequence: int
    step: int
    position: int
    source: str
    doc_id: int
    file: str
    line: int
    record: str
    start: int
    length: int
    n_tokens: int
    meta: str | None = None
    held: tuple[tuple[int, int], ...] | None = None
    text: str | None = None

    @property
    def end(self) -> int:
        """One past the piece's last token in its document (``start + length``)."""
        return self.start + self.length

    def as_json(self) -> dict[str, Any]:
        """The piece for machines: every field (``step`` as ``build_step``), ``end`` too; ``held``, ``text`` and
        ``meta`` only when set."""
        out: dict[str, Any] = {
            "sequence": self.sequence,
            "build_step": self.step,
            "position": self.position,
            "source": self.source,
            "doc_id": self.doc_id,
            "file": self.file,
            "line": self.line,
            "record": self.record,
            "start": self.start,
            "end": self.end,
            "length": self.length,
            "n_tokens": self.n_tokens,
        }
        if self.meta is not None:
            out["meta"] = self.meta
        if self.held is not None:
            out["held"] = [list(r) for r in self.held]
        if self.text is not None:
            out["text"] = self.text
        return out
