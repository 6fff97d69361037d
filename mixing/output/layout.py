"""Where each stage of a build lives on disk, and where the build is published."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.shards import ShardSet
from contract.store import Store

__all__ = ["BuildLayout"]


@dataclass(frozen=True)
class BuildLayout:
    """The folders and files of one mix's build under ``root``, and where the build is published.

    ``root/``: ``weir.duckdb`` (stats and plan tables), ``tokenizer/``, ``sources/<name>/`` (index,
    documents, chunks of tokens), ``plan/`` (parquet copies of the plan), ``shards/`` (packed shards and
    ``manifest.json``, written last), ``commits/`` (each stage's commit record, :mod:`mixing.output.commit`).

    ``target``: the fsspec URL (``s3://bucket/prefix``) the build is published to when it is not ``root``
    itself. Then ``root`` is the driver's local working folder (DuckDB's database, the small files each stage
    makes there before publishing them), while token chunks and shards are written by the engine's workers
    straight to ``target`` and never pass through ``root``.
    """

    root: Path
    target: str | None = None
    storage_options: dict[str, Any] | None = field(default=None, compare=False, hash=False, repr=False)

    @classmethod
    def of(cls, root: Path | BuildLayout) -> BuildLayout:
        """``root`` itself when it is a layout, else the layout of the local build folder ``root``."""
        return root if isinstance(root, BuildLayout) else cls(Path(root))

    @property
    def url(self) -> str:
        """Where the build is published: ``target``, or ``root`` itself."""
        return self.target or str(self.root)

    @property
    def shards_url(self) -> str:
        """The shard folder in the build root (what ``PackedDataset`` and ``weir inspect`` read)."""
        return f"{self.url}/shards"

    def shard_set(self) -> ShardSet:
        """The build's shards (:class:`contract.shards.ShardSet`), wherever the build root is."""
        return ShardSet(self.shards_url, self.storage_options)

    def store(self) -> Store:
        """The build root's storage (:class:`contract.store.Store` at :attr:`url`)."""
        return Store(self.url, self.storage_options)

    @property
    def duckdb(self) -> Path:
        return self.root / "weir.duckdb"

    @property
    def tokenizer_dir(self) -> Path:
        return self.root / "tokenizer"

    def source_dir(self, name: str) -> Path:
        return self.root / "sources" / name

    @property
    def plan_dir(self) -> Path:
        return self.root / "plan"

    @property
    def shards_dir(self) -> Path:
        return self.root / "shards"

    @property
    def manifest(self) -> Path:
        return self.shards_dir / "manifest.json"
