"""Where each stage of a build lives on disk, and how files are written so a partial one is never seen."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mixing.format.shards import ShardSet
    from mixing.format.store import Store

__all__ = ["BuildLayout", "atomic_path", "file_mode", "write_json_atomic"]


@dataclass(frozen=True)
class BuildLayout:
    """The folders and files of one mix's build under ``root``, and where the build is published.

    ``root/``: ``weir.duckdb`` (stats and plan tables), ``tokenizer/``, ``sources/<name>/`` (index,
    documents, chunks of tokens), ``plan/`` (parquet copies of the plan), ``shards/`` (packed shards and
    ``manifest.json``, written last), ``commits/`` (each stage's commit record, :mod:`mixing.format.commit`).

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
        """The build's shards (:class:`mixing.format.shards.ShardSet`), wherever the build root is."""
        from mixing.format.shards import ShardSet

        return ShardSet(self.shards_url, self.storage_options)

    def store(self) -> Store:
        """The build root's storage (:class:`mixing.format.store.Store` at :attr:`url`)."""
        from mixing.format.store import Store  # store.py writes through atomic_path, defined here

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


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; on success rename it over ``final`` (atomic on POSIX).

    On error the temporary file is removed, so readers see either the old file or the complete new one.
    The file is created with mode 0666 less the umask, like any ``open(..., "w")`` (``tempfile.mkstemp``
    would make it 0600, unreadable by a trainer running as another user).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = final.parent / f".{final.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the kernel applies the umask
        except FileExistsError:  # a name another writer just took: draw again
            continue
        os.close(fd)
        break
    try:
        yield Path(tmp)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_mode() -> int:
    """The mode a new file gets now: 0666 less the process's umask (read without changing it where possible)."""
    try:
        with open("/proc/self/status") as f:  # Linux: the umask, without a window where it is changed
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0o22)
        os.umask(umask)
    return 0o666 & ~umask


def write_json_atomic(final: Path, obj: Any) -> None:
    with atomic_path(final) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
