"""The build's DuckDB settings: bounded by default, from the environment, refused in one line naming the variable;
the length tables under a small limit (DuckDB spills) equal those without one."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from contract.errors import WeirError
from mixing.plan.database import DEFAULT_MEMORY, MEMORY_ENV, THREADS_ENV, duckdb_config
from mixing.plan.stats import compute_length_stats
from tests.mixing.plan.test_plan import tables


def test_the_settings_come_from_the_environment_with_a_bounded_default() -> None:
    assert duckdb_config({}) == {"memory_limit": DEFAULT_MEMORY}
    assert duckdb_config({MEMORY_ENV: " 512MB ", THREADS_ENV: "3"}) == {"memory_limit": "512MB", "threads": 3}
    assert duckdb_config({MEMORY_ENV: "1.5GiB"}) == {"memory_limit": "1.5GiB"}
    for env, var in (({MEMORY_ENV: "lots"}, MEMORY_ENV), ({THREADS_ENV: "0"}, THREADS_ENV)):
        with pytest.raises(WeirError, match=rf"^{var}="):
            duckdb_config(env)


def test_length_tables_under_a_small_memory_limit_are_the_same(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    files = {}
    for name, n in (("a", 1_000_000), ("b", 800_000)):
        files[name] = tmp_path / f"{name}.parquet"
        pl.DataFrame(
            {
                "doc_id": np.arange(n),
                "source": name,
                "file": [f"s3://bucket/{name}/part-{i // 1000:05d}.jsonl" for i in range(n)],
                "n_tokens": rng.integers(1, 5000, n),
            }
        ).write_parquet(files[name])
    digests = []
    runs: tuple[tuple[str, dict[str, str | int] | None], ...] = (
        ("free", None),
        ("bounded", {"memory_limit": "64MB", "threads": 1}),
    )
    for run, config in runs:
        db = tmp_path / f"{run}.duckdb"
        compute_length_stats(db, files, 1024, config)
        digests.append(tables(db))
    assert digests[0] == digests[1]


def test_a_build_stage_uses_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from mixing.mixfile.mix import parse_mix
    from mixing.output.layout import BuildLayout
    from mixing.stages import length_stats

    mix = parse_mix(
        "name: m\nsequence: {length: 64, global_batch: 2}\nsources:\n  a: {uri: x}\n"
        "curriculum:\n  - {phase: p, steps: 1, mixture: {a: 1}}\n"
    )
    monkeypatch.setenv(MEMORY_ENV, "a lot")
    with pytest.raises(WeirError, match=f"^{MEMORY_ENV}='a lot'"):
        length_stats(mix, BuildLayout(tmp_path))
