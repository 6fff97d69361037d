"""``loaders.loader.PackedLoader``: with any number of DataLoader workers the consumer gets exactly the
dataset's own stream (no planner context leaks into an item), its ``state_dict`` after each item is the
dataset's after the same items (whatever the workers prefetched), ``load_state_dict`` takes effect at the next
``iter``, it yields single sequences only (``batch_size`` refused), and a worker's ``WeirError`` reaches the
consumer as its own one-line message, of its own type.

(Resumes with workers, another pass, ``persistent_workers`` and ``rewind`` are held in test_dataset.py,
test_steps.py and test_refinement.py.)"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch._utils import ExceptionWrapper

from contract.errors import WeirError
from loaders import Balance, PackedDataset, PackedLoader, World
from loaders.dataset import SHARED_CONTEXTS, ExhaustedError
from loaders.fields import FieldsError
from loaders.integrity import CorruptShardError
from loaders.loader import _one_line
from loaders.state import StateError

# refined (window and period over the tiny build's phase boundary): workers pass contexts along
REFINED = Balance(seed=3, window=3, period=2, slack=1.15)


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a
    )


@pytest.mark.parametrize("balance", [Balance(seed=8), REFINED], ids=["plain", "refined"])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_the_consumer_gets_the_datasets_stream_and_its_state_after_every_item(
    tiny_build: Path, balance: Balance, workers: int
) -> None:
    def make() -> PackedDataset:
        return PackedDataset(tiny_build, world=World(1, 2), balance=balance)

    reference, states = [], []  # the stream read in this process, and the state after each of its items
    ds = make()
    states.append(ds.state_dict())
    for item in ds:
        reference.append(item)
        states.append(ds.state_dict())
    assert (balance is REFINED) == any(s["context"] for s in states)  # a refined stream's states carry contexts
    extra = {"prefetch_factor": 4} if workers else {}
    loader = PackedLoader(make(), num_workers=workers, **extra)
    assert loader.state_dict() == states[0]
    got = []
    for k, item in enumerate(loader, start=1):
        assert SHARED_CONTEXTS not in item
        got.append(item)
        assert loader.state_dict() == states[k], k  # what the consumer got, not what the workers read ahead
    assert len(got) == len(reference) and all(same(a, b) for a, b in zip(got, reference, strict=True))


def test_a_loaded_state_takes_effect_at_the_next_iter(tiny_build: Path) -> None:
    def make() -> PackedLoader:
        return PackedLoader(PackedDataset(tiny_build, world=World(0, 2), balance=REFINED), num_workers=2)

    reference = [i["sequence"] for i in make()]
    first = make()
    head = [i["sequence"] for i in itertools.islice(first, 5)]
    state = first.state_dict()
    later = make()
    list(itertools.islice(later, 9))  # somewhere else in the stream
    later.load_state_dict(state)
    assert later.state_dict() == state  # nothing read since: the state is the loaded one
    assert head + [i["sequence"] for i in later] == reference
    with pytest.raises(ExhaustedError):
        next(iter(later))


@pytest.mark.parametrize("batch_size", [1, 4])
def test_items_are_single_sequences(tiny_build: Path, batch_size: int) -> None:
    ds = PackedDataset(tiny_build, world=World(0, 1))
    with pytest.raises(ValueError, match=r"batch_size must stay None.*StepLoader"):
        PackedLoader(ds, batch_size=batch_size)
    item = next(iter(PackedLoader(ds, batch_size=None)))
    assert item["input_ids"].shape == (ds.facts.seq_len,) and isinstance(item["sequence"], int)


ERRORS = [WeirError, ExhaustedError, FieldsError, StateError, CorruptShardError]
messages = st.text(st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=1, max_size=60).filter(
    lambda s: s.strip() == s
)


def from_a_worker(error: WeirError) -> WeirError:
    """``error`` as a DataLoader hands it over from a worker process (torch's own wrapper)."""
    try:
        raise error
    except WeirError:
        wrapped = ExceptionWrapper(sys.exc_info(), where="in DataLoader worker process 1")
    try:
        wrapped.reraise()
    except WeirError as e:
        return e
    raise AssertionError("not re-raised")


@given(st.sampled_from(ERRORS), messages)
def test_a_workers_error_is_its_own_one_line_message(kind: type[WeirError], message: str) -> None:
    relayed = from_a_worker(kind(message))
    assert type(relayed) is kind and "Original Traceback" in str(relayed)
    got = _one_line(relayed)
    assert type(got) is kind and str(got) == message
    mine = kind(message)  # raised in this process: left as it is
    assert _one_line(mine) is mine


def test_an_error_that_cannot_be_remade_from_its_message_is_left_as_it_came() -> None:
    class Pair(WeirError):
        def __init__(self, a: str, b: str) -> None:
            super().__init__(f"{a}: {b}")

    relayed = Pair("a", "b")
    text = "Caught Pair in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
    relayed.args = (f"{text}{Pair.__module__}.{Pair.__qualname__}: a: b",)
    assert _one_line(relayed) is relayed
