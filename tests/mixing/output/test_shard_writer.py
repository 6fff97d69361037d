"""``mixing.output.shard_writer``, the writer's side of the shard format (``tests/contract/test_shards.py`` reads
what it writes): sequences split into contiguous shards of ``shard_sequences`` read back as given, from an array or
a gathering function alike; ``write_shard`` is a function of its arguments and ``write_shard`` + ``seal_shards``
make the manifest ``write_shards`` makes; a rerun first withdraws the manifest and killed writers' temporaries, and
at its end removes older builds' shard files but nothing else; bad build info is refused before anything is
written; ``token_dtype`` holds every id."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.cost import CostModel
from contract.digests import STEP_DIGESTS, sequence_digests, step_digests, write_step_digests
from contract.manifest import MANIFEST, BuildInfo, ShardError, validated
from contract.shards import ShardSet
from mixing.output.shard_writer import open_shards, seal_shards, token_dtype, write_shard, write_shards

BUILDS = settings(max_examples=20, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
INFO = {"cost": {"attention": 1.0, "linear": 3.0}, "mix": "w", "sources": ["a", "b"]}


@st.composite
def builds(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(tokens [n, S], step [n], seg_offsets [n+1], segments [m, 4]) of a random segmentation."""
    seq_len = draw(st.integers(1, 24))
    n = draw(st.integers(0, 9))
    step = np.sort(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))).astype(np.int64)
    segs: list[tuple[int, int, int, int]] = []
    counts = []
    for _ in range(n):
        left, c = seq_len, 0
        for ln in draw(st.lists(st.integers(1, seq_len), max_size=4)):
            if ln > left:
                break
            segs.append((draw(st.integers(0, 1)), draw(st.integers(0, 99)), draw(st.integers(0, 50)), ln))
            left, c = left - ln, c + 1
        counts.append(c)
    high = draw(st.sampled_from([300, 1 << 16, 70000]))
    tokens = np.random.default_rng(n).integers(0, high, (n, seq_len)).astype(token_dtype(high))
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return tokens, step, offsets, np.array(segs, np.int64).reshape(-1, 4)


@BUILDS
@given(build=builds(), per=st.integers(1, 10))
def test_any_split_into_shards_reads_back_as_written(
    tmp_path_factory: pytest.TempPathFactory, build: tuple[np.ndarray, ...], per: int
) -> None:
    tokens, step, off, segs = build
    n, seq_len = tokens.shape
    root = tmp_path_factory.mktemp("w")
    asked: list[tuple[int, int]] = []
    done: list[int] = []

    def gather(lo: int, hi: int) -> np.ndarray:
        asked.append((lo, hi))
        return tokens[lo:hi]

    from_array = write_shards(root / "a", tokens, step, off, segs, per, INFO, seq_len=seq_len)
    from_function = write_shards(root / "f", gather, step, off, segs, per, INFO, seq_len=seq_len, on_shard=done.append)
    assert from_function == from_array  # the same files, byte for byte
    bounds = [(lo, min(n, lo + per)) for lo in range(0, n, per)]
    assert asked == bounds and done == list(range(len(bounds)))  # one block per shard, in order
    assert [(s.first_sequence, s.first_sequence + s.sequences) for s in from_array.shards] == bounds
    per_step = np.unique(step, return_counts=True)[1]
    uniform = n > 0 and (per_step == per_step[0]).all()
    assert from_array.sequences_per_step == (int(per_step[0]) if uniform else None)
    assert (from_array.sequences, from_array.seq_len) == (n, seq_len)
    assert n == 0 or from_array.dtype == str(tokens.dtype)  # (an empty build has no token file to type)

    shards = ShardSet(root / "f")
    assert shards.verify() == [] and np.array_equal(shards.steps, step)
    cost = CostModel(1.0, 3.0)
    for i in range(n):
        v = shards.sequence(i)
        assert np.array_equal(v.tokens, tokens[i]) and np.array_equal(v.segments, segs[off[i] : off[i + 1]])
        assert v.seg_cost is not None and np.array_equal(v.seg_cost, cost.of(segs[off[i] : off[i + 1], 3]))
    lengths = segs[:, 3]
    assert np.array_equal(shards.seq_tokens, [lengths[off[i] : off[i + 1]].sum() for i in range(n)])
    assert np.array_equal(shards.seq_cost, cost.sequences(off, lengths))


def test_the_two_halves_make_the_manifest_write_shards_makes(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 1000, (5, 8)).astype(np.uint16)
    step, off = np.array([0, 0, 1, 1, 2]), np.array([0, 2, 3, 3, 5, 6])
    segs = np.array([[0, 1, 0, 4], [1, 2, 0, 4], [0, 3, 4, 8], [1, 4, 0, 5], [1, 5, 0, 3], [0, 6, 0, 7]])
    whole = write_shards(tmp_path / "whole", tokens, step, off, segs, 2, INFO)
    info = validated(BuildInfo, INFO, "info")
    entries = []
    for where in ("halves", "again"):  # whichever process writes shard k writes the same bytes
        store = open_shards(tmp_path / where)
        entries.append(
            [
                write_shard(
                    store,
                    k,
                    lo,
                    tokens[lo : lo + 2],
                    step[lo : lo + 2],
                    off[lo : lo + 3] - off[lo],
                    segs[off[lo] : off[min(lo + 2, 5)]],
                    info.cost,
                )
                for k, lo in enumerate(range(0, 5, 2))
            ]
        )
    assert entries[0] == entries[1] == list(whole.shards)
    digests = step_digests(step, sequence_digests(tokens, off, segs[:, 3]), 3)  # what the halves' driver adds
    info = info.model_copy(update={"step_digests": write_step_digests(open_shards(tmp_path / "halves"), digests)})
    sealed = seal_shards(open_shards(tmp_path / "halves"), info, entries[0], None, 8, np.uint16)
    assert (
        sealed == whole
        and (tmp_path / "halves" / MANIFEST).read_bytes() == (tmp_path / "whole" / MANIFEST).read_bytes()
    )


def test_a_rerun_withdraws_the_manifest_first_and_clears_only_its_own_files_at_the_end(tmp_path: Path) -> None:
    tokens = np.arange(6 * 4, dtype=np.uint16).reshape(6, 4)
    off, segs = np.arange(7), np.array([[0, i, 0, 4] for i in range(6)])
    old = write_shards(tmp_path, tokens, np.arange(6), off, segs, 1, INFO)
    assert len(old.shards) == 6
    (tmp_path / "README.txt").write_text("not the writer's")
    (tmp_path / ".shard-00009.tokens.npy.ab12cd34.tmp").write_bytes(b"half")  # a killed writer's file
    store = open_shards(tmp_path)
    assert not (tmp_path / MANIFEST).exists()  # from here on no reader trusts the folder
    with pytest.raises(ShardError, match="no manifest"):
        ShardSet(tmp_path)
    assert sorted(store.names()) == sorted(
        [f.name for s in old.shards for f in s.files.both()] + ["README.txt", STEP_DIGESTS]
    )
    new = write_shards(tmp_path, tokens[:3], np.arange(3), off[:4], segs[:3], 2, INFO)
    assert len(new.shards) == 2 and ShardSet(tmp_path).verify() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f.name for s in new.shards for f in s.files.both()] + [MANIFEST, "README.txt", STEP_DIGESTS]
    )


@pytest.mark.parametrize(
    ("info", "says"),
    [
        ({"note": "x"}, "note: not a field of the manifest"),
        ({"cost": {"attention": -1.0}}, "cost"),
        ({"vocab_size": 10, "pad_id": 10}, "pad_id 10 is not below vocab_size 10"),
    ],
)
def test_bad_build_info_is_refused_before_anything_is_written(tmp_path: Path, info: dict, says: str) -> None:  # type: ignore[type-arg]
    tokens, segs = np.zeros((2, 4), np.uint16), np.array([[0, 0, 0, 4], [0, 1, 0, 4]])
    old = write_shards(tmp_path, tokens, np.arange(2), np.arange(3), segs, 1, INFO)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ShardError, match=rf"^{tmp_path}/{MANIFEST}: .*{says}") as e:
        write_shards(tmp_path, tokens + 1, np.arange(2), np.arange(3), segs, 2, info)
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before and ShardSet(tmp_path).manifest == old


@given(vocab_size=st.integers(1, 1 << 32))
def test_token_dtype_is_the_smallest_that_holds_every_id(vocab_size: int) -> None:
    dtype = token_dtype(vocab_size)
    assert np.iinfo(dtype).max >= vocab_size - 1
    assert (dtype is np.uint16) == (vocab_size - 1 <= np.iinfo(np.uint16).max)
