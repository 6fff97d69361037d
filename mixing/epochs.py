"""Epochs: per source, what a span of a build's steps took of it (what ``weir epochs`` prints).

Per source, over build steps ``[A, B)``: ``tokens_seen`` (all its segments' lengths), ``unique_tokens`` (each
piece, by (doc_id, start), counted once), ``repeated_tokens`` (seen − unique), and ``epochs`` = seen ÷ the
source's tokens (``n_tokens`` summed over its ``docs.parquet``), fractional. :func:`count_epochs` counts them
from the span's segments (as :mod:`contract.shards` holds them: (source index, doc_id, start, length) per
segment); :meth:`mixing.provenance.Provenance.epochs` reads that span and each source's tokens. Deterministic:
the same segments give the same report.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["EpochsReport", "SourceEpochs", "count_epochs"]


@dataclass(frozen=True)
class SourceEpochs:
    """One source over a span of build steps: see the module's docstring. ``tokens``: the source's own
    tokens (its documents', EOS included); ``epochs`` is 0 for a source without any."""

    source: str
    tokens: int
    tokens_seen: int
    unique_tokens: int

    @property
    def repeated_tokens(self) -> int:
        return self.tokens_seen - self.unique_tokens

    @property
    def epochs(self) -> float:
        return self.tokens_seen / self.tokens if self.tokens else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "tokens_seen": self.tokens_seen,
            "unique_tokens": self.unique_tokens,
            "repeated_tokens": self.repeated_tokens,
            "epochs": self.epochs,
        }


@dataclass(frozen=True)
class EpochsReport:
    """Every source of the build (the manifest's order) over build steps ``first … stop − 1``."""

    first: int
    stop: int
    sources: tuple[SourceEpochs, ...] = field(default_factory=tuple)

    def as_json(self) -> dict[str, Any]:
        return {"steps": [self.first, self.stop], "sources": {s.source: s.as_json() for s in self.sources}}


def count_epochs(
    segs: np.ndarray, first: int, stop: int, sources: Sequence[str], tokens: Callable[[int], int]
) -> EpochsReport:
    """The report of build steps ``first … stop − 1`` from their segments ``segs`` (int64 [n, 4]: source index,
    doc_id, start, length): one :class:`SourceEpochs` per name of ``sources`` (index ``k`` is source ``k``), its
    ``tokens`` from ``tokens(k)``, called once per source, in order."""
    out = []
    for k, name in enumerate(sources):
        mine = segs[segs[:, 0] == k]
        # a piece is (doc_id, start): the same piece drawn again in a later epoch is a repeat
        _, first_at = np.unique(mine[:, 1:3], axis=0, return_index=True)
        out.append(
            SourceEpochs(
                source=name,
                tokens=tokens(k),
                tokens_seen=int(mine[:, 3].sum()),
                unique_tokens=int(mine[first_at, 3].sum()),
            )
        )
    return EpochsReport(first, stop, tuple(out))
