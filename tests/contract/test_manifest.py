"""The typed, versioned build contract: builds written by older weir (formats 1 and 2) still read through
``ShardSet``, the loader and ``weir inspect``, with the contract's defaults for what they lack; any other
version is refused in one line naming it."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from contract.cost import CostModel
from contract.manifest import MANIFEST, ShardError, seal
from contract.record import NO_REGROUP
from contract.shards import ShardSet, sha256_file
from loaders import Balance, PackedDataset, Reading, World
from tests.conftest import ROOT, TINY_MIX, write_tiny_sources
from tests.mixing.pack.test_packing import _build

# what format 3 added (the checksum, eos_id, seed); format 2 then added the cost and token arrays, the cost
# model, the balance options, sequences_per_step, documents_dropped and how the shards were packed
NOT_IN_2 = ("manifest_sha256", "eos_id", "seed")
NOT_IN_1 = (*NOT_IN_2, "cost", "micro_batches", "max_tokens", "regroup", "sequences_per_step", "packing")


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("tiny")
    write_tiny_sources(base / "data")
    (base / "tiny.yaml").write_text(TINY_MIX.format(root=base / "data"))
    return _build(base / "tiny.yaml", base / "build").root


def rewrite_as(build: Path, version: int, dest: Path) -> Path:
    """A copy of ``build`` as weir wrote format ``version``: the manifest without the fields that format
    lacked (and no checksum), format 1's shards with its three metadata arrays only."""
    shutil.copytree(build, dest)
    path = dest / "shards" / MANIFEST
    m = json.loads(path.read_text())
    for key in NOT_IN_1 if version == 1 else NOT_IN_2:
        m.pop(key)
    if version == 1:
        for counts in m["per_source"].values():
            counts.pop("documents_dropped")
        for shard in m["shards"]:
            f = shard["files"]["meta"]
            meta = dest / "shards" / f["name"]
            with np.load(meta) as z:
                old = {k: z[k] for k in ("step", "seg_offsets", "segments")}
            with meta.open("wb") as out:
                np.savez(out, **old)
            f["bytes"], f["sha256"] = meta.stat().st_size, sha256_file(meta)
    path.write_text(json.dumps({**m, "format_version": version}, indent=2, sort_keys=True) + "\n")
    return dest


def inspect(build: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pipelines.cli", "inspect", str(build), *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.fixture(scope="module")
def sealed(tiny_build: Path) -> dict[str, Any]:
    """``weir inspect --json`` of the (format 3, sealed) tiny build, which every old format is compared with."""
    return dict(json.loads(inspect(tiny_build, "--json").stdout))


@pytest.mark.parametrize("version", [1, 2])
def test_an_old_build_reads_with_the_contracts_defaults(
    tiny_build: Path, sealed: dict[str, Any], tmp_path: Path, version: int
) -> None:
    old = rewrite_as(tiny_build, version, tmp_path / "old")
    new, shards = ShardSet(tiny_build / "shards"), ShardSet(old / "shards")
    m = shards.manifest
    assert (m.format_version, shards.sealed, m.manifest_sha256) == (version, False, None)
    assert (m.seed, m.eos_id, m.pad_id, m.steps, m.sources) == (0, None, new.manifest.pad_id, 8, ("notes", "qa"))
    if version == 1:  # no cost model recorded: the contract's (attention only), costs derived from it on read
        assert (m.cost, m.micro_batches, m.max_tokens, m.regrouping) == (CostModel(), "equal", None, NO_REGROUP)
        assert m.per_source is not None and all(s.documents_dropped is None for s in m.per_source.values())
        offs, segs = shards.segments
        assert np.array_equal(shards.seq_cost, CostModel().sequences(offs, segs[:, 3]))
    else:
        assert m.cost == new.manifest.cost == CostModel(1.0, 8192.0)
        assert np.array_equal(shards.seq_cost, new.seq_cost)

    # the loader yields the same items (the seed given: an old build records none)
    want = list(
        PackedDataset(
            tiny_build, world=World(0, 1), balance=Balance(seed=7), reading=Reading(cache_dir=tmp_path / "c3")
        )
    )
    ds = PackedDataset(old, world=World(0, 1), balance=Balance(seed=7), reading=Reading(cache_dir=tmp_path / "c"))
    got = list(ds)
    assert len(got) == len(want) == 32
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys() and all(
            np.array_equal(a[k], b[k]) if hasattr(a[k], "shape") else a[k] == b[k] for k in a
        )
    assert (ds.facts.seed, ds.facts.eos_id, ds.facts.cost, ds.settings.balance.seed) == (0, None, m.cost, 7)
    default = PackedDataset(old, world=World(0, 1), reading=Reading(cache_dir=tmp_path / "c"))
    assert default.settings.balance.seed == 0  # the contract's default seed

    # weir inspect reads it, says once that it carries no checksum, and finds the same figures
    r = inspect(old, "--json")
    assert r.returncode == 0, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and MANIFEST in lines[0] and f"format {version}" in lines[0]
    report = json.loads(r.stdout)
    assert (report["format_version"], report["manifest_sealed"]) == (version, False)
    differ = {"format_version", "manifest_sealed"} | ({"sequence_cost", "per_source"} if version == 1 else set())
    assert {k: v for k, v in report.items() if k not in differ} == {k: v for k, v in sealed.items() if k not in differ}
    if version == 1:  # the cost model differs (the default one); documents_dropped was not recorded
        for name, row in report["per_source"].items():
            assert row == {k: v for k, v in sealed["per_source"][name].items() if k != "documents_dropped"}


@pytest.mark.parametrize("version", [0, 5])
def test_an_unknown_version_is_refused_in_one_line_naming_it(tiny_build: Path, tmp_path: Path, version: int) -> None:
    copy = tmp_path / "b"
    shutil.copytree(tiny_build, copy)
    path = copy / "shards" / MANIFEST
    m = json.loads(path.read_text())
    path.write_text(json.dumps(seal({**m, "format_version": version}), indent=2, sort_keys=True) + "\n")
    want = f"{path}: format_version {version}; this reader knows [1, 2, 3, 4]"
    for read in (
        lambda: ShardSet(copy / "shards"),
        lambda: PackedDataset(copy, world=World(0, 1), reading=Reading(cache_dir=tmp_path / "c")),
    ):
        with pytest.raises(ShardError) as e:
            read()
        assert str(e.value) == want
    r = inspect(copy)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].endswith(want), r.stderr
