"""Item fields: the arrays a :class:`loaders.PackedDataset` item can carry, and the check of a requested set.

A trainer that computes labels and positions itself (:mod:`loaders.targets`, on its own device) asks only for
what it uses, e.g. ``fields=("input_ids", "cu_seqlens")``; the loader then writes only those arrays. Every
item also carries the Python ints ``step``, ``slot``, ``sequence`` and ``num_tokens`` (real tokens of the
full sequence, i.e. where its trailing padding starts), whatever the fields.

With ``cp_size > 1`` ``labels`` cannot be left out: the label of the last slot of a CP chunk is the first
token of the next chunk, which another CP rank holds, so only the loader (which sees the whole sequence
before the split) can give them. ``position_ids`` can always be rebuilt (:func:`loaders.targets.position_ids`
from ``indices`` with CP).

Provenance (:data:`PROVENANCE_FIELDS`) is opt-in by name, never in the default (``fields=None`` is :data:`FIELDS`):
where each token came from, for a loss per source (:mod:`loaders.provenance`). ``segments`` int64 [k, 3] is
per segment, aligned with ``cu_seqlens`` (row ``i`` describes ``cu_seqlens[i]:cu_seqlens[i+1]``, of the full
sequence also under CP): columns :data:`SEGMENT_COLUMNS`, the source index (the names are
``ds.facts.sources``), the document's id in its source and the offset of the segment's first token in its
document (non-zero for the later pieces of a split document); the trailing padding's row is -1 throughout.
One tensor for the three, so that the provenance costs an item one tensor more to make and a trainer one
copy more to its device. ``source_ids`` int32 [n] is the per-slot view: the source index of each of the
item's slots (the rank's slots under CP), -1 on trailing and CP padding.
"""

from __future__ import annotations

from collections.abc import Iterable

from contract.errors import WeirError

__all__ = ["FIELDS", "IGNORE_INDEX", "PROVENANCE_FIELDS", "SEGMENT_COLUMNS", "FieldsError", "check_fields"]

IGNORE_INDEX = -100

FIELDS = ("input_ids", "labels", "position_ids", "indices", "cu_seqlens", "cu_seqlens_padded")
PROVENANCE_FIELDS = ("source_ids", "segments")  # opt-in only: see the module's docstring
SEGMENT_COLUMNS = ("source", "doc_id", "offset")  # the columns of an item's ``segments``
# the per-segment fields of earlier releases, one tensor each: now the columns of ``segments``
_RENAMED = {"seg_source": 0, "seg_doc": 1, "seg_offset": 2}
_KNOWN = FIELDS + PROVENANCE_FIELDS


class FieldsError(WeirError, ValueError):
    """A ``fields`` request the loader cannot serve (the message names the field)."""


def check_fields(fields: Iterable[str] | None, cp_size: int) -> tuple[str, ...]:
    """The requested fields in :data:`FIELDS` then :data:`PROVENANCE_FIELDS` order (:data:`FIELDS` for None:
    no provenance unless asked); ValueError naming an unknown field, a bare string, or ``labels`` left out
    with ``cp_size > 1`` (:class:`FieldsError`, a ValueError)."""
    if fields is None:
        return FIELDS
    if isinstance(fields, str):
        raise FieldsError(f"fields must be a collection of field names, not the string {fields!r}")
    wanted = list(fields)
    unknown = [f for f in wanted if f not in _KNOWN]
    if unknown and unknown[0] in _RENAMED:
        raise FieldsError(
            f"item field {unknown[0]!r} is now column {_RENAMED[unknown[0]]} of 'segments' (int64 [k, 3]: "
            f"{', '.join(SEGMENT_COLUMNS)}); ask for 'segments' and read item['segments'][:, {_RENAMED[unknown[0]]}]"
        )
    if unknown:
        raise FieldsError(f"unknown item field {unknown[0]!r}; expected some of {list(_KNOWN)}")
    if cp_size > 1 and "labels" not in wanted:
        raise FieldsError(
            "fields must include 'labels' when cp_size > 1: a CP chunk's last label is a token another CP rank "
            "holds, so the trainer cannot rebuild labels from its own input_ids"
        )
    return tuple(f for f in _KNOWN if f in wanted)
