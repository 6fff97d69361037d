"""Item fields: the arrays a :class:`loaders.PackedDataset` item can carry, and the check of a requested set.

A trainer that computes labels and positions itself (:mod:`loaders.targets`, on its own device) asks only for
what it uses, e.g. ``fields=("input_ids", "cu_seqlens")``; the loader then writes only those arrays. Every
item also carries the Python ints ``step``, ``slot``, ``sequence`` and ``num_tokens`` (real tokens of the
full sequence, i.e. where its trailing padding starts), whatever the fields.

With ``cp_size > 1`` ``labels`` cannot be left out: the label of the last slot of a CP chunk is the first
token of the next chunk, which another CP rank holds, so only the loader (which sees the whole sequence
before the split) can give them. ``position_ids`` can always be rebuilt (:func:`loaders.targets.position_ids`
from ``indices`` with CP).
"""

from __future__ import annotations

from collections.abc import Iterable

from contract.errors import WeirError

__all__ = ["FIELDS", "IGNORE_INDEX", "FieldsError", "check_fields"]

IGNORE_INDEX = -100

FIELDS = ("input_ids", "labels", "position_ids", "indices", "cu_seqlens", "cu_seqlens_padded")


class FieldsError(WeirError, ValueError):
    """A ``fields`` request the loader cannot serve (the message names the field)."""


def check_fields(fields: Iterable[str] | None, cp_size: int) -> tuple[str, ...]:
    """The requested fields in :data:`FIELDS` order (all of them for None); ValueError naming an unknown
    field, a bare string, or ``labels`` left out with ``cp_size > 1`` (:class:`FieldsError`, a ValueError)."""
    if fields is None:
        return FIELDS
    if isinstance(fields, str):
        raise FieldsError(f"fields must be a collection of field names, not the string {fields!r}")
    wanted = list(fields)
    unknown = [f for f in wanted if f not in FIELDS]
    if unknown:
        raise FieldsError(f"unknown item field {unknown[0]!r}; expected some of {list(FIELDS)}")
    if cp_size > 1 and "labels" not in wanted:
        raise FieldsError(
            "fields must include 'labels' when cp_size > 1: a CP chunk's last label is a token another CP rank "
            "holds, so the trainer cannot rebuild labels from its own input_ids"
        )
    return tuple(f for f in FIELDS if f in wanted)
