"""The packed shard format: memory-mappable token arrays plus per-sequence document boundaries.

A shard folder holds, per shard ``k``: ``shard-{k:05d}.tokens.npy`` (uint16 when the vocabulary fits,
else uint32; shape [n, S]) and ``shard-{k:05d}.meta.npz`` (``step`` int64 [n], ``seg_offsets`` int64
[n+1], ``segments`` int64 [m, 4] = source index, doc_id, start, length). Tokens past the last segment
of a sequence are padding (``pad_id``). ``manifest.json`` is written last and lists every file with its
size and sha256; a folder without a manifest is not a build. Every file is written under a temporary
name and renamed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from mixing.errors import WeirError
from mixing.layout import atomic_path, write_json_atomic

__all__ = ["FORMAT_VERSION", "SequenceView", "ShardError", "ShardSet", "sha256_file", "write_shards"]

FORMAT_VERSION = 1


class ShardError(WeirError, RuntimeError):
    """A missing manifest, a checksum mismatch, or a format this reader does not know."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def write_shards(
    out_dir: Path,
    tokens: np.ndarray,
    step: np.ndarray,
    seg_offsets: np.ndarray,
    segments: np.ndarray,
    shard_sequences: int,
    manifest: dict[str, Any],
) -> dict[str, Any]:
    """Write sequences ``tokens`` [n, S] with their metadata as shards, then the manifest (last).

    ``manifest`` holds the caller's fields (fingerprints, sources, ...); this adds the format fields and
    the shard list, writes it, and returns it.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "manifest.json").unlink(missing_ok=True)  # the old build is no longer valid from here on
    n, seq_len = tokens.shape
    shards = []
    for k, lo in enumerate(range(0, n, shard_sequences)):
        hi = min(n, lo + shard_sequences)
        names = {"tokens": f"shard-{k:05d}.tokens.npy", "meta": f"shard-{k:05d}.meta.npz"}
        with atomic_path(out_dir / names["tokens"]) as tmp, tmp.open("wb") as f:
            np.save(f, np.ascontiguousarray(tokens[lo:hi]))
        s0, s1 = seg_offsets[lo], seg_offsets[hi]
        with atomic_path(out_dir / names["meta"]) as tmp, tmp.open("wb") as f:
            np.savez(f, step=step[lo:hi], seg_offsets=seg_offsets[lo : hi + 1] - s0, segments=segments[s0:s1])
        shards.append(
            {
                "first_sequence": lo,
                "sequences": hi - lo,
                "files": {
                    role: {
                        "name": name,
                        "bytes": (out_dir / name).stat().st_size,
                        "sha256": sha256_file(out_dir / name),
                    }
                    for role, name in names.items()
                },
            }
        )
    full = {
        **manifest,
        "format_version": FORMAT_VERSION,
        "seq_len": seq_len,
        "sequences": n,
        "dtype": str(tokens.dtype),
        "shards": shards,
    }
    write_json_atomic(out_dir / "manifest.json", full)
    return full


@dataclass(frozen=True)
class SequenceView:
    """One packed sequence: ``tokens`` [S], ``segments`` [k, 4] (source, doc_id, start, length), ``step``."""

    index: int
    step: int
    tokens: np.ndarray
    segments: np.ndarray


class ShardSet:
    """Read-only access to a build's shards by global sequence index; shards are memory-mapped lazily."""

    def __init__(self, shards_dir: Path | str) -> None:
        self.dir = Path(shards_dir)
        path = self.dir / "manifest.json"
        if not path.exists():
            raise ShardError(f"{self.dir}: no manifest.json; the build is missing or did not finish")
        self.manifest: dict[str, Any] = json.loads(path.read_text())
        if self.manifest.get("format_version") != FORMAT_VERSION:
            raise ShardError(
                f"{path}: format_version {self.manifest.get('format_version')}; this reader knows {FORMAT_VERSION}"
            )
        self._starts = np.array([s["first_sequence"] for s in self.manifest["shards"]], dtype=np.int64)
        self._open: dict[int, tuple[np.ndarray, dict[str, np.ndarray]]] = {}

    def __len__(self) -> int:
        return int(self.manifest["sequences"])

    @cached_property
    def steps(self) -> np.ndarray:
        """Step of every sequence, int64 [len(self)], non-decreasing."""
        return np.concatenate([self._shard(k)[1]["step"] for k in range(len(self._starts))] or [np.zeros(0, np.int64)])

    def _shard(self, k: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        if k not in self._open:
            files = self.manifest["shards"][k]["files"]
            tokens = np.load(self.dir / files["tokens"]["name"], mmap_mode="r")
            with np.load(self.dir / files["meta"]["name"]) as z:
                meta = {key: z[key] for key in z.files}
            self._open[k] = (tokens, meta)
        return self._open[k]

    def sequence(self, i: int) -> SequenceView:
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} out of range [0, {len(self)})")
        k = int(np.searchsorted(self._starts, i, side="right") - 1)
        tokens, meta = self._shard(k)
        j = i - int(self._starts[k])
        a, b = meta["seg_offsets"][j], meta["seg_offsets"][j + 1]
        return SequenceView(i, int(meta["step"][j]), tokens[j], meta["segments"][a:b])

    def verify(self) -> list[str]:
        """Names of shard files whose size or sha256 differs from the manifest (empty when all are sound)."""
        bad = []
        for shard in self.manifest["shards"]:
            for f in shard["files"].values():
                p = self.dir / f["name"]
                if not p.exists() or p.stat().st_size != f["bytes"] or sha256_file(p) != f["sha256"]:
                    bad.append(f["name"])
        return bad
