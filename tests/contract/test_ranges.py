"""``contract.ranges``: the requests' bytes cut back are exactly each range's slice of the object (empty and
reversed ranges included, those empty); ranges less than GAP apart share a request, no request spans more than
BLOCK bytes unless one range alone does, and an empty range is never asked for. (Through a Store, locally and on
S3: tests/contract/test_store.py.)"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contract.ranges import BLOCK, GAP, coalesce

SIZE = 3 * GAP + 4096  # an object that ranges more than GAP apart fit in
DATA = bytes(range(256)) * (SIZE // 256)
OFFSET = st.integers(0, len(DATA))


@settings(max_examples=60)
@given(ranges=st.lists(st.tuples(OFFSET, OFFSET), max_size=30))
def test_cut_gives_each_ranges_slice_of_the_object(ranges: list[tuple[int, int]]) -> None:
    requests = coalesce(ranges)
    got = [DATA[s:e] for s, e in requests.blocks]
    assert requests.cut(got) == [DATA[s:e] for s, e in ranges]
    assert all(e > s for s, e in requests.blocks), "no empty request"
    assert len(requests.blocks) <= len(requests.wanted) == sum(e > s for s, e in ranges)
    assert [s for s, _ in requests.blocks] == sorted(s for s, _ in requests.blocks)


def test_close_ranges_share_a_request_and_far_ones_do_not() -> None:
    assert coalesce([(10, 20), (0, 5), (20 + GAP, 30 + GAP)]).blocks == [[0, 30 + GAP]]
    assert coalesce([(0, 5), (6 + GAP, 9 + GAP)]).blocks == [[0, 5], [6 + GAP, 9 + GAP]]
    assert coalesce([(0, 100), (50, 60), (90, 200)]).blocks == [[0, 200]], "overlapping and nested ranges"


def test_no_request_spans_more_than_block_unless_one_range_does() -> None:
    assert coalesce([(0, BLOCK - 10), (BLOCK - 5, BLOCK)]).blocks == [[0, BLOCK]]
    assert coalesce([(0, BLOCK - 10), (BLOCK - 5, BLOCK + 1)]).blocks == [[0, BLOCK - 10], [BLOCK - 5, BLOCK + 1]]
    assert coalesce([(5, 5 + 2 * BLOCK)]).blocks == [[5, 5 + 2 * BLOCK]]


def test_empty_and_reversed_ranges_are_never_asked_for() -> None:
    requests = coalesce([(7, 7), (9, 3)])
    assert requests.blocks == [] and requests.wanted == []
    assert requests.cut([]) == [b"", b""]
    assert coalesce([]).cut([]) == []
