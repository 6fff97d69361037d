"""``loaders.fields``: ``check_fields`` gives any request of known fields back in ``FIELDS`` then
``PROVENANCE_FIELDS`` order, once each (all of ``FIELDS``, no provenance, for None), and refuses an unknown
name, a bare string, or ``labels`` left out under CP with a one-line ``FieldsError`` that is a ``ValueError``
and a ``WeirError`` naming the problem; ``IGNORE_INDEX`` can never be a token id."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from contract.errors import WeirError
from loaders.config import Payload
from loaders.fields import FIELDS, IGNORE_INDEX, PROVENANCE_FIELDS, FieldsError, check_fields

known = st.lists(st.sampled_from(FIELDS + PROVENANCE_FIELDS), max_size=12)
cp_sizes = st.integers(1, 8)


def test_none_is_every_field_and_the_fields_are_distinct() -> None:
    assert check_fields(None, 1) == FIELDS
    assert check_fields(None, 4) == FIELDS  # all of them include labels, whatever the CP size
    assert len(set(FIELDS)) == len(FIELDS) and "input_ids" in FIELDS and "labels" in FIELDS


def test_ignore_index_is_no_token_id() -> None:
    assert isinstance(IGNORE_INDEX, int) and IGNORE_INDEX < 0  # token ids are ≥ 0: never mistaken for one


@given(known, st.sampled_from([list, tuple, iter, lambda x: dict.fromkeys(x)]))
def test_known_fields_come_back_in_canonical_order_once_each(
    wanted: list[str], kind: Callable[[list[str]], Iterable[str]]
) -> None:
    got = check_fields(kind(wanted), 1)
    assert set(got) == set(wanted)
    assert list(got) == sorted(got, key=(FIELDS + PROVENANCE_FIELDS).index) and len(set(got)) == len(got)
    assert check_fields(got, 1) == got  # idempotent


@given(known, cp_sizes)
def test_under_cp_labels_are_required_and_otherwise_anything_known_passes(wanted: list[str], cp: int) -> None:
    if cp > 1 and "labels" not in wanted:
        with pytest.raises(FieldsError, match="'labels'") as err:
            check_fields(wanted, cp)
        assert "\n" not in str(err.value)
    else:
        assert set(check_fields(wanted, cp)) == set(wanted)


@given(
    known, st.text(min_size=1, max_size=12).filter(lambda s: s not in FIELDS + PROVENANCE_FIELDS), st.data(), cp_sizes
)
def test_an_unknown_field_is_named_in_one_line(wanted: list[str], bad: str, data: st.DataObject, cp: int) -> None:
    at = data.draw(st.integers(0, len(wanted)))
    with pytest.raises(FieldsError) as err:
        check_fields([*wanted[:at], bad, *wanted[at:]], cp)
    assert isinstance(err.value, ValueError) and isinstance(err.value, WeirError)
    assert repr(bad) in str(err.value)
    assert "\n" not in str(err.value)


@given(st.sampled_from(["", *FIELDS, "input_ids,labels"]), cp_sizes)
def test_a_bare_string_is_refused_even_when_it_names_a_field(text: str, cp: int) -> None:
    with pytest.raises(FieldsError, match="not the string") as err:
        check_fields(text, cp)
    assert "\n" not in str(err.value)


def test_provenance_is_asked_by_name_and_never_a_default() -> None:
    assert not set(PROVENANCE_FIELDS) & set(FIELDS) and len(set(PROVENANCE_FIELDS)) == len(PROVENANCE_FIELDS)
    assert Payload().fields is None and check_fields(Payload().fields, 2) == FIELDS
    assert Payload(fields=("segments", "source_ids", "input_ids")).fields == ("segments", "source_ids", "input_ids")
    assert check_fields(("segments", "labels", "source_ids"), 4) == ("labels", "source_ids", "segments")
    with pytest.raises(FieldsError, match="'source_id'"):
        Payload(fields=("input_ids", "source_id"))
    with pytest.raises(FieldsError, match="'labels'"):  # provenance does not lift the CP rule
        check_fields(PROVENANCE_FIELDS, 2)


@pytest.mark.parametrize(("old", "column"), [("seg_source", 0), ("seg_doc", 1), ("seg_offset", 2)])
def test_an_earlier_per_segment_field_names_its_column_of_segments(old: str, column: int) -> None:
    with pytest.raises(FieldsError, match=rf"'{old}' is now column {column} of 'segments'") as err:
        check_fields(("input_ids", old), 1)
    assert f"item['segments'][:, {column}]" in str(err.value) and "\n" not in str(err.value)
