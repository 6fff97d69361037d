"""``PackedDataset.facts``: the run's facts, typed, equal to what the build recorded and to what the loader
yields; the loader's default seed is the mix file's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract.manifest import parse_manifest
from contract.shards import ShardSet
from loaders import Balance, PackedDataset, RunFacts, World
from loaders.facts import CostModel, PhaseFacts


def test_facts_are_the_builds_and_match_what_the_loader_yields(tiny_build: Path) -> None:
    ds = PackedDataset(tiny_build, world=World(0, 1))
    facts = ds.facts
    m = json.loads((tiny_build / "shards" / "manifest.json").read_text())
    assert isinstance(facts, RunFacts)
    with pytest.raises(AttributeError):
        facts.steps = 1  # type: ignore[misc]  # frozen
    items = list(ds)
    shards = ShardSet(tiny_build / "shards")
    assert facts.steps == m["steps"] == 8 == len({it["step"] for it in items})  # the LR planner's length
    assert facts.sequences == len(items) == facts.steps * facts.global_batch
    assert facts.tokens == sum(it["num_tokens"] for it in items) == int(shards.seq_tokens.sum())
    assert (facts.seq_len, facts.global_batch, facts.tokens_per_step) == (64, 4, 256)
    assert all(len(it["input_ids"]) == facts.seq_len for it in items)
    assert (facts.vocab_size, facts.eos_id, facts.pad_id, facts.pad_is_eos) == (257, 256, 256, True)  # bytes: no pad
    assert all((it["input_ids"][it["num_tokens"] :] == facts.pad_id).all() for it in items)
    assert facts.cost == CostModel(m["cost"]["attention"], m["cost"]["linear"])
    assert facts.phases == (PhaseFacts("first", 0, 3), PhaseFacts("second", 3, 5))
    assert sum(p.steps for p in facts.phases) == facts.steps
    assert (facts.mix, facts.seed, facts.sources, facts.micro_batches, facts.max_tokens) == (
        "tiny",
        7,
        ("notes", "qa"),
        "equal",
        None,
    )


def test_the_loaders_default_seed_is_the_mix_files(tiny_build: Path) -> None:
    """One seed fixes the run: the tiny mix says ``seed: 7``, and the loader deals with 7 unless told."""
    default, seven, zero = (PackedDataset(tiny_build, world=World(1, 2), balance=Balance(seed=s)) for s in (None, 7, 0))
    assert default.settings.balance.seed == 7 == default.state_dict()["seed"]
    assert [it["sequence"] for it in default] == [it["sequence"] for it in seven]
    assert [it["sequence"] for it in PackedDataset(tiny_build, world=World(1, 2))] != [it["sequence"] for it in zero]


def test_a_manifest_without_the_new_fields_gives_none_and_seed_zero() -> None:
    files = {kind: {"name": f"shard-00000.{kind}", "bytes": 1, "sha256": "0" * 64} for kind in ("tokens", "meta")}
    fields = {"seq_len": 8, "global_batch": 2, "sequences": 4, "pad_id": 3}
    old = {"format_version": 2, "dtype": "uint16", "shards": [{"first_sequence": 0, "sequences": 4, "files": files}]}
    m, sealed = parse_manifest(json.dumps({**old, **fields}).encode(), "manifest.json")
    assert not sealed
    facts = RunFacts.from_manifest(m, steps=2, tokens=20)
    assert (facts.seed, facts.eos_id, facts.vocab_size, facts.pad_id, facts.pad_is_eos) == (0, None, None, 3, False)
    assert (facts.phases, facts.cost, facts.micro_batches) == ((), CostModel(), "equal")
