"""The loader's config: every group checked when made, every unset value the build's, resolved in one place."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from contract.manifest import write_manifest
from contract.record import NO_REGROUP
from contract.shards import ShardSet
from loaders import Balance, FieldsError, LoaderConfig, PackedDataset, Payload, Reading, World
from loaders.config import BalanceSettings
from loaders.planner import EDGE_WINDOWS, LAYOUT


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Balance(window=0), "window must be ≥ 1"),
        (lambda: Balance(period=-1), "period must be ≥ 0"),
        (lambda: Balance(slack=-0.5), "slack must be a finite number ≥ 0"),
        (lambda: Balance(slack=float("nan")), "slack must be a finite number ≥ 0"),
        (lambda: Balance(micro_batches="ragged"), "micro_batches must be one of"),
        (lambda: Balance(layout=2), "layout must be one of"),
        (lambda: Balance(edges=-1), "edges must be ≥ 0"),
        (lambda: Payload(chunk=0), "chunk must be ≥ 1"),
        (lambda: Payload(fields=("input_ids", "label")), "'label'"),
        (lambda: Payload(fields="input_ids"), "not the string"),
        (lambda: Reading(cache_bytes=0), "cache_bytes must be ≥ 1"),
        (lambda: LoaderConfig(world=World(), cp_split="diagonal"), "unknown CP split 'diagonal'"),
        (
            lambda: LoaderConfig(world=World(0, 1, 0, 2), payload=Payload(fields=("input_ids",))),
            "must include 'labels' when cp_size > 1",
        ),
    ],
)
def test_each_group_is_checked_when_made(make, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_field_error_is_raised_before_the_build_is_opened(tmp_path: Path) -> None:
    with pytest.raises(FieldsError):  # the path does not exist: the config is checked first
        PackedDataset(tmp_path / "nothing", world=World(), payload=Payload(fields=("tokens",)))


def test_unset_values_are_the_builds_and_set_ones_win(tiny_build: Path, tmp_path: Path) -> None:
    shards = ShardSet(tiny_build / "shards")
    m = shards.manifest
    assert m.regroup is None and m.micro_batches == "equal"
    default = Balance().resolve(m)
    assert default == BalanceSettings(
        m.seed, NO_REGROUP.window, NO_REGROUP.period, NO_REGROUP.slack, "equal", LAYOUT, EDGE_WINDOWS
    )  # a build records no layout and no edges: the planner's defaults
    mine = Balance(seed=3, window=2, period=0, slack=0.0, micro_batches="unequal", layout=0, edges=2).resolve(m)
    assert mine == BalanceSettings(3, 2, 0, 0.0, "unequal", 0, 2)

    copy = tmp_path / "build"
    shutil.copytree(tiny_build / "shards", copy / "shards")
    record = json.loads((copy / "shards" / "manifest.json").read_text())
    record.update(seed=41, micro_batches="unequal", regroup={"window": 2, "period": 2, "slack": 1.2})
    write_manifest(copy / "shards", record)
    ds = PackedDataset(copy, world=World(0, 2), balance=Balance(period=0))
    assert ds.settings.balance == BalanceSettings(41, 2, 0, 1.2, "unequal", LAYOUT, EDGE_WINDOWS)
    assert ds.state_dict()["seed"] == 41 and ds.planner.window == 2 and ds.planner.period == 0


def test_the_dataset_keeps_what_was_asked_and_what_it_resolved(tiny_build: Path) -> None:
    ds = PackedDataset(
        tiny_build,
        world=World(1, 2, 0, 2),
        balance=Balance(window=2),
        cp_split="contiguous",
        payload=Payload(fields=["labels", "input_ids"]),
    )
    assert ds.config.payload.fields == ("labels", "input_ids")  # as given (a tuple: the config is frozen)
    assert ds.settings.fields == ("input_ids", "labels")  # in FIELDS order
    assert ds.settings.chunk == min(64, (2 << 20) // (8 * ds.facts.seq_len))
    assert ds.world == ds.config.world == World(1, 2, 0, 2) and ds.settings.cp_split == "contiguous"
    assert ds.config.balance.seed is None and ds.settings.balance.seed == ds.facts.seed


def test_a_split_of_whole_sequences_needs_seq_len_divisible_by_2cp(tiny_build: Path) -> None:
    S = ShardSet(tiny_build / "shards").manifest.seq_len
    cp = next(c for c in range(2, 64) if S % (2 * c))
    with pytest.raises(ValueError, match=f"sequence length {S} is not divisible by 2·cp_size {2 * cp}"):
        PackedDataset(tiny_build, world=World(0, 1, 0, cp), cp_split="sequence_zigzag")
    PackedDataset(tiny_build, world=World(0, 1, 0, cp))  # the per-document zigzag pads each document


def test_reading_has_one_default_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("WEIR_CACHE_DIR", raising=False)
    assert Reading().cache == tmp_path / ".cache" / "weir"
    assert Reading(cache_dir="/scratch/weir").cache == Path("/scratch/weir")
    monkeypatch.setenv("WEIR_CACHE_DIR", "~/local-disk/weir")  # a job's environment names the node's disk
    assert Reading().cache == tmp_path / "local-disk" / "weir"
    assert Reading(cache_dir="/scratch/weir").cache == Path("/scratch/weir")  # the argument wins
