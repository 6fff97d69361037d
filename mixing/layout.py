"""Where each stage of a build lives on disk, and how files are written so a partial one is never seen."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BuildLayout", "atomic_path", "write_json_atomic"]


@dataclass(frozen=True)
class BuildLayout:
    """The folders and files of one mix's build under ``root``.

    ``root/``: ``weir.duckdb`` (stats and plan tables), ``tokenizer/``, ``sources/<name>/`` (index,
    documents, tokens), ``plan/`` (parquet copies of the plan), ``shards/`` (packed shards and
    ``manifest.json``, written last).
    """

    root: Path

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
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(final: Path, obj: Any) -> None:
    with atomic_path(final) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
