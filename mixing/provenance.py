"""Every token's provenance: the documents behind a step of a build, and how often each source was seen.

A build's shards name, per sequence, its segments: (source index, doc_id, start, length)
(:mod:`contract.shards`); each source's document index ``sources/<name>/docs.parquet``
(:data:`mixing.ingest.doc_index.INDEX_SCHEMA`) names each document's file and record. :class:`Provenance`
joins the two, lazily: a lookup reads the shards holding the sequences asked for, and of each source's
``docs.parquet`` only the footer and, of the row groups holding the documents asked for, the columns shown
(:mod:`mixing.doc_lookup`; ``doc_id`` is the row's position in the source's index: the index is written in that
order). ``weir lookup`` and ``weir epochs`` print what it returns (:class:`mixing.piece.Piece` s,
:class:`mixing.epochs.EpochsReport`).

**Steps.** Everything here is in the *build's* steps, as packed: build step ``t`` is sequences
``t·g … (t+1)·g − 1`` (``g`` the build's sequences per step). The *training* step a loader hands out, and which
DP rank reads which of its sequences, is :mod:`loaders.planner`'s, and ``mixing`` never imports the loader
(tests/test_layers.py): a caller that can (the ``weir`` CLI, in ``pipelines``) asks the planner which
sequences make a training step or a rank's share of one, and passes them to :meth:`Provenance.lookup`; the
CP rank's slots come the same way, as a function of a sequence's segment lengths (``slots``).

**Records.** A document's ``line`` means what the source's format made of it (the line of a jsonl file, the
row of a parquet or csv file, ...); the build does not record the format, so each piece's ``record`` reads it
from the file's name (:func:`mixing.record_labels.record_label`: ``line N``, ``row N``, ``piece N``,
``member N (path)``, ``whole file``).

**Text.** A piece's text is its tokens as the shards hold them (what was trained on) decoded by the build's
tokenizer (``tokenizer/spec.json`` and ``tokenizer.json``; :mod:`mixing.decoder`), without the document's BOS
and EOS tokens, so that a whole document's text is the source's record as rendered (its ``template`` applied).
A piece that cuts a character's bytes (byte-level BPE, ``bytes``) shows U+FFFD for the cut bytes.

**Epochs.** Per source, over build steps ``[A, B)``: tokens seen, unique and repeated, and epochs
(:mod:`mixing.epochs` says how each is counted).

Every failure is a :class:`ProvenanceError` of one line that names the file and what to do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from contract.errors import WeirError, first_line
from contract.shards import ShardError
from mixing.decoder import Decode, DecoderError, load_decoder
from mixing.doc_lookup import DocLookup, DocRow, IndexMisfit
from mixing.epochs import EpochsReport, count_epochs
from mixing.output.layout import BuildLayout
from mixing.piece import Piece
from mixing.record_labels import record_label

__all__ = ["Provenance", "ProvenanceError", "Slots", "step_range"]


class ProvenanceError(WeirError, ValueError):
    """A build, step or source that cannot be looked up; the message says which and what to do."""


def step_range(text: str | None, steps: int) -> tuple[int, int]:
    """``"A:B"`` (either side may be left out: ``"A:"``, ``":B"``; ``None``: all) as build steps ``[A, B)`` of a
    build of ``steps`` steps; :class:`ProvenanceError` for another form or a range outside ``[0, steps]``."""
    if text is None:
        return 0, steps
    m = re.fullmatch(r"\s*(\d*)\s*:\s*(\d*)\s*", text)
    if m is None:
        raise ProvenanceError(f"--steps {text!r}: expected A:B (build steps A to B-1; A: or :B for open ends)")
    a = int(m[1]) if m[1] else 0
    b = int(m[2]) if m[2] else steps
    if not a < b <= steps:
        raise ProvenanceError(
            f"--steps {text!r}: the build has steps 0..{steps - 1}; give A:B with 0 ≤ A < B ≤ {steps}"
        )
    return a, b


Slots = Callable[[np.ndarray], np.ndarray]
"""A CP rank's slots of a sequence: its real segments' lengths (int64 [k]) → the positions in the sequence the
rank holds (int64; ``-1`` for padding), as :mod:`loaders.context_parallel`'s splits return them."""


class Provenance:
    """A finished build opened for lookups: its shards now, each source's index and the tokenizer when first
    needed (kept for the next lookup). ``root``: a local build folder (or its ``shards/``), or a
    :class:`~mixing.output.layout.BuildLayout` (a build in object storage read with its driver's working folder).

    Raises :class:`ProvenanceError` when the build has no readable manifest or does not record how many
    sequences make a step.
    """

    def __init__(self, root: Path | str | BuildLayout) -> None:
        if isinstance(root, BuildLayout):
            self.layout = root
        else:
            local = Path(root)
            self.layout = BuildLayout(local.parent if local.name == "shards" else local)
        try:
            self.shards = self.layout.shard_set()
        except ShardError as e:
            raise ProvenanceError(f"{e}; give the folder weir build wrote (its --out)") from None
        m = self.shards.manifest
        per_step = m.sequences_per_step or m.global_batch
        if not per_step:
            raise ProvenanceError(
                f"{self.layout.shards_url}/manifest.json records no sequences per step; rebuild it with this weir"
            )
        self.per_step = per_step
        self.steps = m.steps if m.steps is not None else len(self.shards) // per_step
        self.sources: tuple[str, ...] = tuple(m.sources or ())
        self._docs: dict[int, DocLookup] = {}
        self._decode: Decode | None = None
        self._bounds: tuple[bool, bool] = (False, True)  # (BOS first, EOS last) of every document

    def step_sequences(self, step: int) -> np.ndarray:
        """The global sequences of build step ``step`` (int64, in the build's order); :class:`ProvenanceError`
        naming the build's steps when it has no such step (a loader hands out as many training steps)."""
        if not 0 <= step < self.steps:
            raise ProvenanceError(
                f"{self.layout.url} has no step {step}: its steps are 0..{self.steps - 1}; pick one of those"
            )
        return np.arange(step * self.per_step, (step + 1) * self.per_step, dtype=np.int64)

    def lookup(
        self, sequences: Sequence[int] | np.ndarray, *, text: bool = False, slots: Slots | None = None
    ) -> list[Piece]:
        """Every segment of ``sequences`` (global indices, in the order given), in order inside each: see
        :class:`~mixing.piece.Piece`. ``text``: decode each piece's tokens; ``slots``: a CP rank's slots
        (:data:`Slots`), which sets each piece's ``held``. Reads only the shards holding ``sequences`` and, per
        source, the row groups of its ``docs.parquet`` holding their documents. :class:`ProvenanceError` when a
        source's index is gone or does not fit the shards (another tokenizer, fewer documents or tokens than the
        shards name)."""
        views = []
        for i in (int(s) for s in sequences):
            if not 0 <= i < len(self.shards):
                raise ProvenanceError(
                    f"{self.layout.url} has no sequence {i}: it has {len(self.shards)} (steps 0..{self.steps - 1})"
                )
            try:
                views.append(self.shards.sequence(i))
            except ShardError as e:
                raise ProvenanceError(f"{e}; check the build with weir inspect, or rebuild it") from None
        wanted: dict[int, set[int]] = {}
        for v in views:
            for src, doc in v.segments[:, :2].tolist():
                wanted.setdefault(src, set()).add(doc)
        rows = {src: self._documents(src, sorted(docs)) for src, docs in wanted.items()}
        if text:
            self._tokenizer()
        pieces, contents = [], []
        for v in views:
            lengths = v.segments[:, 3]
            cu = np.concatenate([[0], np.cumsum(lengths)])
            held = _held(cu, v.segments[:, 2], slots(lengths)) if slots is not None else None
            for j, (src, doc, start, length) in enumerate(v.segments.tolist()):
                file, line, n_tokens, meta = rows[src][doc]
                if start + length > n_tokens:
                    raise self._misfit(
                        src, f"document {doc} has {n_tokens} tokens, the shards take {start}..{start + length}"
                    )
                pieces.append(
                    Piece(
                        sequence=v.index,
                        step=v.step,
                        position=int(cu[j]),
                        source=self.sources[src],
                        doc_id=doc,
                        file=file,
                        line=line,
                        record=record_label(file, line, meta),
                        start=start,
                        length=length,
                        n_tokens=n_tokens,
                        meta=meta,
                        held=None if held is None else held[j],
                    )
                )
                if text:
                    contents.append(self._content(v.tokens[cu[j] : cu[j + 1]], start, n_tokens))
        if not text:
            return pieces
        assert self._decode is not None
        return [replace(p, text=t) for p, t in zip(pieces, self._decode(contents), strict=True)]

    def epochs(self, first: int = 0, stop: int | None = None) -> EpochsReport:
        """Per source, what build steps ``first … stop − 1`` (default: all) took of it
        (:class:`~mixing.epochs.SourceEpochs`).
        Reads the segments of those steps' shards and each source's ``n_tokens`` column."""
        stop = self.steps if stop is None else stop
        if not 0 <= first < stop <= self.steps:
            raise ProvenanceError(
                f"build steps {first}..{stop - 1} are not in {self.layout.url}: it has 0..{self.steps - 1}"
            )
        try:
            span = self.shards.span(first * self.per_step, stop * self.per_step)
        except ShardError as e:
            raise ProvenanceError(f"{e}; check the build with weir inspect, or rebuild it") from None
        return count_epochs(span.segments, first, stop, self.sources, self._source_tokens)

    # --- the sources' indexes -------------------------------------------------------------------------------

    def _index(self, src: int) -> DocLookup:
        """Source ``src``'s ``docs.parquet``, opened (its footer read) once."""
        if src not in self._docs:
            if not 0 <= src < len(self.sources):
                raise ProvenanceError(
                    f"{self.layout.shards_url}/manifest.json names {len(self.sources)} sources, the shards source "
                    f"{src}; rebuild the build"
                )
            path = self.layout.source_dir(self.sources[src]) / "docs.parquet"
            try:
                self._docs[src] = DocLookup(path, self.shards.manifest.tokenizer_fingerprint)
            except FileNotFoundError:
                raise ProvenanceError(
                    f"{path}: missing, the document index of source {self.sources[src]!r} is gone; build the mix "
                    f"again into {self.layout.url} (weir build MIX --out {self.layout.url})"
                ) from None
            except IndexMisfit as e:
                raise self._misfit(src, str(e)) from None
            except Exception as e:  # pyarrow's own errors on a damaged file: name it
                raise ProvenanceError(
                    f"{path}: not a readable parquet file ({first_line(e)}); build the mix again into {self.layout.url}"
                ) from None
        return self._docs[src]

    def _documents(self, src: int, docs: list[int]) -> dict[int, DocRow]:
        """``doc_id → (file, line, n_tokens, meta)`` of source ``src``'s ``docs`` (sorted, distinct): the row
        groups holding them read, nothing else (:class:`~mixing.doc_lookup.DocLookup`)."""
        index = self._index(src)
        try:
            return dict(zip(docs, index.rows(np.asarray(docs, dtype=np.int64)), strict=True))
        except IndexMisfit as e:
            raise self._misfit(src, str(e)) from None

    def _source_tokens(self, src: int) -> int:
        """The tokens of source ``src``'s documents, one row group of ``n_tokens`` at a time."""
        index = self._index(src)
        try:
            return index.tokens()
        except IndexMisfit as e:
            raise self._misfit(src, str(e)) from None

    def _misfit(self, src: int, why: str) -> ProvenanceError:
        path = self.layout.source_dir(self.sources[src]) / "docs.parquet"
        return ProvenanceError(
            f"{path} does not fit the shards ({why}); it is from another build: build the mix again into "
            f"{self.layout.url}"
        )

    # --- text ----------------------------------------------------------------------------------------------

    def _tokenizer(self) -> None:
        """The build's decoder (from ``tokenizer/spec.json``), loaded once."""
        if self._decode is not None:
            return
        folder = self.layout.tokenizer_dir
        try:
            spec = json.loads((folder / "spec.json").read_text())
        except (OSError, ValueError) as e:
            raise ProvenanceError(
                f"{folder}/spec.json: cannot read it ({first_line(e)}); build the mix again into {self.layout.url}"
            ) from None
        try:
            self._decode = load_decoder(spec, folder)
        except DecoderError as e:  # the decoder's own one-line message, as this module's error
            raise ProvenanceError(str(e)) from None
        self._bounds = (bool(spec.get("bos", False)), bool(spec.get("eos", True)))

    def _content(self, tokens: np.ndarray, start: int, n_tokens: int) -> list[int]:
        """A piece's tokens (``tokens``, of its document from ``start``) less the document's BOS (its first
        token) and EOS (its last)."""
        bos, eos = self._bounds
        a = 1 if bos and start == 0 else 0
        b = len(tokens) - 1 if eos and start + len(tokens) == n_tokens else len(tokens)
        return np.asarray(tokens[a : max(a, b)], dtype=np.int64).tolist()


def _held(cu: np.ndarray, starts: np.ndarray, positions: np.ndarray) -> list[tuple[tuple[int, int], ...]]:
    """Per segment (boundaries ``cu``, int64 [k+1]; first document token ``starts`` [k]), the document ranges
    the slots ``positions`` (``-1``: padding; at or past ``cu[-1]``: the trailing padding) cover, merged."""
    pos = np.sort(positions[(positions >= 0) & (positions < cu[-1])])
    out: list[list[tuple[int, int]]] = [[] for _ in range(len(cu) - 1)]
    if not len(pos):
        return [tuple(r) for r in out]
    seg = np.searchsorted(cu, pos, side="right") - 1
    # a run ends where the next slot is not the next position, or is another segment's
    cut = np.flatnonzero((np.diff(pos) != 1) | (np.diff(seg) != 0)) + 1
    for a, b in zip(np.r_[0, cut].tolist(), np.r_[cut, len(pos)].tolist(), strict=True):
        j = int(seg[a])
        base = int(starts[j]) - int(cu[j])
        out[j].append((int(pos[a]) + base, int(pos[b - 1]) + 1 + base))
    return [tuple(r) for r in out]
