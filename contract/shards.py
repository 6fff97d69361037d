"""The packed shard format (version 3): memory-mappable token arrays plus per-sequence metadata.

A shard folder (a local path or any fsspec URL, e.g. ``s3://bucket/prefix``) holds, per shard ``k``:

- ``shard-{k:05d}.tokens.npy``: token ids [n, S], uint16 when the vocabulary fits, else uint32. Slots past
  a sequence's last segment are padding (``pad_id``). Memory-mapped when local.
- ``shard-{k:05d}.meta.npz``: ``step`` int64 [n]; ``seg_offsets`` int64 [n+1] into the segment arrays;
  ``segments`` int64 [m, 4] = (source index, doc_id, start, length) in order inside each sequence;
  ``seg_cost`` float64 [m] and ``seq_cost`` float64 [n]: each segment's and sequence's cost under the
  manifest's cost model (:mod:`contract.cost`); ``seq_tokens`` int64 [n].
  ``cu_seqlens`` of sequence j = [0, cumsum(segments[seg_offsets[j]:seg_offsets[j+1], 3])].
- ``manifest.json``, written **last**: the typed :class:`~contract.manifest.Manifest`, i.e.
  ``format_version``, ``seq_len``, ``dtype``, ``sequences``, ``sequences_per_step``, the caller's
  :class:`~contract.manifest.BuildInfo` (mix and tokenizer fingerprints, steps, sources, cost, ...),
  ``shards``: per shard ``first_sequence``, ``sequences`` and its files with ``bytes`` and ``sha256``, and
  ``manifest_sha256``, the checksum of the manifest itself.

Every file is written under a temporary name and renamed (local: ``os.replace``; object stores: the object
appears whole on upload, then is moved). The old manifest is removed before the first shard is written,
so a folder whose build was interrupted has no manifest and no reader trusts it; rerunning completes it.

Every reader validates what it opens and raises one :class:`ShardError` line naming the file: the manifest
through :func:`contract.manifest.parse_manifest`, each shard file when first used (unreadable, truncated or
missing; arrays of the wrong shape, dtype or range). ``verify`` compares every file with its checksum.
"""

from __future__ import annotations

import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from contract.errors import first_line
from contract.index import map_index
from contract.manifest import (
    FORMAT_VERSION,
    MANIFEST,
    ShardError,
    parse_manifest,
)
from contract.store import Store, sha256_file

__all__ = [
    "FORMAT_VERSION",
    "SequenceSpan",
    "SequenceView",
    "ShardError",
    "ShardSet",
    "sha256_file",
]


@dataclass(frozen=True)
class SequenceView:
    """One packed sequence: ``tokens`` [S], ``segments`` [k, 4] (source, doc_id, start, length), ``step``.

    ``seg_cost`` float64 [k]: each segment's cost under the manifest's cost model.
    """

    index: int
    step: int
    tokens: np.ndarray
    segments: np.ndarray
    seg_cost: np.ndarray | None = None

    @property
    def cu_seqlens(self) -> np.ndarray:
        """int32 [k+1]: document boundaries inside the sequence (padding, if any, not included)."""
        return np.concatenate([[0], np.cumsum(self.segments[:, 3])]).astype(np.int32)


@dataclass(frozen=True)
class SequenceSpan:
    """Consecutive sequences' stored metadata: ``seq_cost`` float64 [n] (each sequence's cost under the
    manifest's cost model), ``seg_offsets`` int64 [n+1] (from 0) into ``segments`` int64 [m, 4] = (source,
    doc_id, start, length)."""

    seq_cost: np.ndarray
    seg_offsets: np.ndarray
    segments: np.ndarray


class ShardSet:
    """Read-only access to a build's shards by global sequence index (local folder or fsspec URL).

    Local shards are memory-mapped lazily; remote ones are fetched whole on first use.
    ``dir`` is the folder as a ``Path`` (for URLs, ``url`` is the authority). Opening validates the
    manifest (:func:`contract.manifest.parse_manifest`); ``sealed`` is False for a manifest written before
    manifests carried their own checksum (format < 3). Each shard is validated when first used.
    The whole-build metadata (``steps``, ``segments``, ...) is read from every shard and concatenated in this
    process, unless :meth:`use_index` maps a build index (:mod:`contract.index`) instead.
    """

    def __init__(self, shards_dir: Path | str, storage_options: dict[str, Any] | None = None) -> None:
        self._store = Store(shards_dir, storage_options)
        self.url = self._store.url
        self.dir = self._store.path
        try:
            self.manifest_bytes = self._store.read(MANIFEST)
        except FileNotFoundError:
            raise ShardError(f"{self.url}: no {MANIFEST}; the build is missing or did not finish") from None
        except OSError as e:
            raise ShardError(f"{self.url}/{MANIFEST}: cannot read it ({first_line(e)})") from None
        self.manifest, self.sealed = parse_manifest(self.manifest_bytes, f"{self.url}/{MANIFEST}")
        self._starts = np.array([s.first_sequence for s in self.manifest.shards], dtype=np.int64)
        self._open: dict[int, tuple[np.ndarray, dict[str, np.ndarray]]] = {}
        self._index_dir: Path | None = None
        self._index: dict[str, np.ndarray] | None = None

    @property
    def store(self) -> Store:
        """The shards folder's storage (for the files the manifest lists beside the shards)."""
        return self._store

    def use_index(self, folder: Path) -> None:
        """Serve :attr:`steps`, :attr:`seq_cost`, :attr:`seq_tokens`, :attr:`segments` and :meth:`sequence`'s
        metadata from the index in ``folder`` (:mod:`contract.index`), memory-mapped: no shard's ``meta.npz``
        is read any more, nothing per sequence is copied into this process. The caller vouches for the files
        (checksums); their shapes are checked here (``ShardError`` naming the folder)."""
        try:
            self._index = map_index(folder, len(self))
        except ValueError as e:
            raise ShardError(f"{folder}: index unusable ({first_line(e)})") from None
        self._index_dir = folder
        for name in ("steps", "seq_cost", "seq_tokens", "segments"):
            self.__dict__.pop(name, None)
        self._open = {k: (tokens, {}) for k, (tokens, _meta) in self._open.items()}

    @property
    def index(self) -> dict[str, np.ndarray] | None:
        """The memory-mapped index arrays (:mod:`contract.index`) when :meth:`use_index` was called, else None."""
        if self._index is None and self._index_dir is not None:  # unpickled in a spawned worker: map again
            self._index = map_index(self._index_dir, len(self))
        return self._index

    def __getstate__(self) -> dict[str, Any]:
        # a spawned worker maps the files again: pickling a map (or arrays read from the shards) would copy it
        drop = {"_open", "_index", "steps", "seq_cost", "seq_tokens", "segments"}
        return {k: v for k, v in self.__dict__.items() if k not in drop} | {"_open": {}, "_index": None}

    def __len__(self) -> int:
        return self.manifest.sequences

    # With an index (use_index) these are its memory maps; else each is read from every shard and concatenated
    # in this process (cached), as readers of a whole build that need no index (mixing's tools) do.
    @cached_property
    def steps(self) -> np.ndarray:
        """Step of every sequence, int64 [len(self)], non-decreasing."""
        return self._concat("step", np.int64)

    @cached_property
    def seq_cost(self) -> np.ndarray:
        """Cost of every sequence (Σ cost of its segments), float64 [len(self)]."""
        return self._concat("seq_cost", np.float64)

    @cached_property
    def seq_tokens(self) -> np.ndarray:
        """Real (non-padding) tokens of every sequence, int64 [len(self)]."""
        return self._concat("seq_tokens", np.int64)

    @cached_property
    def segments(self) -> tuple[np.ndarray, np.ndarray]:
        """All sequences' segments: (seg_offsets int64 [n+1], segments int64 [m, 4])."""
        if self.index is not None:
            return self.index["seg_offsets"], self.index["segments"]
        offs, segs, base = [np.zeros(1, np.int64)], [np.zeros((0, 4), np.int64)], 0
        for k in range(len(self._starts)):
            meta = self._shard(k)[1]
            offs.append(meta["seg_offsets"][1:] + base)
            segs.append(meta["segments"])
            base += len(meta["segments"])
        return np.concatenate(offs), np.concatenate(segs)

    def span(self, lo: int, hi: int) -> SequenceSpan:
        """The stored metadata of sequences ``lo`` … ``hi − 1`` (see :class:`SequenceSpan`): from the index when
        one is mapped, else from the shards holding them only (a streamed build fetches no other shard)."""
        if self.index is not None:
            ix = self.index
            off = np.asarray(ix["seg_offsets"][lo : hi + 1])
            return SequenceSpan(ix["seq_cost"][lo:hi], off - off[0], ix["segments"][off[0] : off[-1]])
        costs, offs, segs, base = [np.zeros(0)], [np.zeros(1, np.int64)], [np.zeros((0, 4), np.int64)], 0
        first = int(np.searchsorted(self._starts, lo, side="right") - 1)
        for k in range(max(first, 0), len(self._starts)):
            start = int(self._starts[k])
            if start >= hi:
                break
            meta = self._shard(k)[1]
            a, b = max(lo, start) - start, min(hi, start + self.manifest.shards[k].sequences) - start
            if a >= b:
                continue
            o = meta["seg_offsets"]
            costs.append(meta["seq_cost"][a:b])
            offs.append(o[a + 1 : b + 1] - o[a] + base)
            segs.append(meta["segments"][o[a] : o[b]])
            base += int(o[b] - o[a])
        return SequenceSpan(np.concatenate(costs), np.concatenate(offs), np.concatenate(segs))

    def _concat(self, key: str, dtype: type) -> np.ndarray:
        if self.index is not None:
            return self.index[key]
        parts = [self._shard(k)[1][key] for k in range(len(self._starts))]
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)

    def _shard(self, k: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Shard ``k``'s tokens and, without an index, its metadata (an empty dict with one), kept open."""
        if k not in self._open:
            shard = self.manifest.shards[k]
            tokens = self._load_tokens(shard.files.tokens.name, shard.rows)[: shard.sequences]
            self._open[k] = (tokens, {} if self.index is not None else self.shard_meta(k))
        return self._open[k]

    def shard_meta(self, k: int) -> dict[str, np.ndarray]:
        """Shard ``k``'s metadata arrays read from its ``meta.npz`` (validated; a format 1 shard's cost and token
        arrays derived), not kept: ``step``, ``seg_offsets``, ``segments``, ``seg_cost``, ``seq_tokens``,
        ``seq_cost``."""
        shard = self.manifest.shards[k]
        meta = self._load_meta(shard.files.meta.name, shard.rows)
        if shard.stored is not None:  # a continuation takes the first rows of its base's shard
            meta = _first_rows(meta, shard.sequences)
        if "seg_cost" not in meta:  # format 1: derived once here, as the build would have stored them
            cost, off, lengths = self.manifest.cost, meta["seg_offsets"], meta["segments"][:, 3]
            cum_t = np.concatenate([[0], np.cumsum(lengths)])
            meta["seg_cost"] = cost.of(lengths)
            meta["seq_tokens"] = cum_t[off[1:]] - cum_t[off[:-1]]
            meta["seq_cost"] = cost.sequences(off, lengths)
        return meta

    def _bad(self, name: str, what: str) -> ShardError:
        return ShardError(f"{self.url}/{name}: {what}")

    def _load_tokens(self, name: str, n: int) -> np.ndarray:
        try:
            if self._store.local:
                tokens = np.load(self.dir / name, mmap_mode="r", allow_pickle=False)
            else:
                tokens = np.load(io.BytesIO(self._store.read(name)), allow_pickle=False)
        except FileNotFoundError:
            raise self._bad(name, f"missing ({MANIFEST} lists it)") from None
        except Exception as e:  # whatever numpy trips on, the file is damaged: name it
            raise self._bad(name, f"not a readable .npy file ({_numpy_says(e)})") from None
        want, dtype = (n, self.manifest.seq_len), np.dtype(self.manifest.dtype)
        if not isinstance(tokens, np.ndarray) or tokens.shape != want or tokens.dtype != dtype:
            got = f"{tokens.dtype} {tokens.shape}" if isinstance(tokens, np.ndarray) else type(tokens).__name__
            raise self._bad(name, f"holds {got}, {MANIFEST} says {dtype} {want}")
        return tokens

    def _load_meta(self, name: str, n: int) -> dict[str, np.ndarray]:
        try:
            with np.load(io.BytesIO(self._store.read(name)), allow_pickle=False) as z:
                meta = {key: z[key] for key in z.files}
        except FileNotFoundError:
            raise self._bad(name, f"missing ({MANIFEST} lists it)") from None
        except Exception as e:  # whatever numpy or zipfile trips on, the file is damaged
            raise self._bad(name, f"not a readable .npz file ({_numpy_says(e)})") from None
        m = self.manifest
        n_sources = len(m.sources) if m.sources is not None else None
        problem = _meta_problem(meta, n, m.format_version, m.seq_len, n_sources)
        if problem:
            raise self._bad(name, problem)
        return meta

    def shard_tokens(self, k: int) -> np.ndarray:
        """Tokens of shard ``k``, [its sequences, S] (memory-mapped when local)."""
        return self._shard(k)[0]

    def sequence(self, i: int) -> SequenceView:
        if not 0 <= i < len(self):
            raise IndexError(f"sequence {i} out of range [0, {len(self)})")
        k = int(np.searchsorted(self._starts, i, side="right") - 1)
        tokens, meta = self._shard(k)
        row = i - int(self._starts[k])
        meta, j = (meta, row) if self.index is None else (self.index, i)  # the shard's metadata or the build's
        a, b = meta["seg_offsets"][j], meta["seg_offsets"][j + 1]
        return SequenceView(i, int(meta["step"][j]), tokens[row], meta["segments"][a:b], meta["seg_cost"][a:b])

    def file_problems(self) -> dict[str, str]:
        """Shard files that differ from the manifest, name → what is wrong (missing, size, sha256).

        Files are hashed on up to 8 threads (hashlib and file reads release the GIL), in manifest order.
        """
        files = [f for shard in self.manifest.shards for f in shard.files.both()]

        def digest(name: str) -> tuple[int, str] | OSError | None:
            try:
                return self._store.digest(name)
            except OSError as e:
                return e

        with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, max(1, len(files)))) as pool:
            digests = list(pool.map(digest, [f.name for f in files]))
        bad = {}
        for f, got in zip(files, digests, strict=True):
            if isinstance(got, OSError):
                bad[f.name] = f"cannot read it ({first_line(got)})"
            elif got is None:
                bad[f.name] = f"missing ({MANIFEST} lists it)"
            elif got[0] != f.bytes:
                bad[f.name] = f"{got[0]} bytes, {MANIFEST} says {f.bytes}"
            elif got[1] != f.sha256:
                bad[f.name] = f"sha256 differs from {MANIFEST}'s"
        return bad

    def verify(self) -> list[str]:
        """Names of shard files whose size or sha256 differs from the manifest (empty when all are sound)."""
        return list(self.file_problems())


def _first_rows(meta: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
    """The metadata of a shard's first ``n`` sequences (of a validated ``meta``)."""
    off = meta["seg_offsets"][: n + 1]
    per_seq, per_seg = {"step", "seq_tokens", "seq_cost"}, {"segments", "seg_cost"}
    out = {k: v[:n] if k in per_seq else v[: off[-1]] if k in per_seg else v for k, v in meta.items()}
    out["seg_offsets"] = off
    return out


_META_V1 = {"step": 1, "seg_offsets": 1, "segments": 2}  # array → ndim
_META = {**_META_V1, "seg_cost": 1, "seq_tokens": 1, "seq_cost": 1}


def _meta_problem(meta: dict[str, np.ndarray], n: int, version: int, seq_len: int, sources: int | None) -> str:
    """What is wrong with a shard's metadata arrays for ``n`` sequences, or "" when they are sound."""
    need = _META_V1 if version == 1 else _META
    missing = sorted(set(need) - set(meta))
    if missing:
        return f"lacks the arrays {missing}"
    for key, ndim in need.items():
        if meta[key].ndim != ndim or not np.issubdtype(meta[key].dtype, np.number):
            return f"{key} is {meta[key].dtype} with {meta[key].ndim} dimensions, expected {ndim} of numbers"
    off, segs, m = meta["seg_offsets"], meta["segments"], len(meta["segments"])
    shapes = {"step": (n,), "seg_offsets": (n + 1,), "segments": (m, 4)}
    shapes |= {} if version == 1 else {"seg_cost": (m,), "seq_tokens": (n,), "seq_cost": (n,)}
    for key, shape in shapes.items():
        if meta[key].shape != shape:
            return f"{key} has shape {meta[key].shape}, expected {shape} for {n} sequences"
    if off[0] != 0 or off[-1] != m or (np.diff(off) < 0).any():
        return f"seg_offsets are not non-decreasing from 0 to {m}"
    step = meta["step"]
    if n and (step[0] < 0 or (np.diff(step) < 0).any()):
        return "step is negative or decreasing"
    if m and (segs[:, 1:] < 0).any():
        return "segments hold a negative doc_id, start or length"
    if m and sources is not None and ((segs[:, 0] < 0) | (segs[:, 0] >= sources)).any():
        return f"segments name a source index outside [0, {sources}) of the manifest's sources"
    cum = np.concatenate([[0], np.cumsum(segs[:, 3])])
    real = cum[off[1:]] - cum[off[:-1]]
    if (real > seq_len).any():
        return f"a sequence's segments hold more than seq_len {seq_len} tokens"
    if version > 1 and not np.array_equal(real, meta["seq_tokens"]):
        return "seq_tokens differ from the segments' lengths"
    return ""


def _numpy_says(e: Exception) -> str:
    """numpy's complaint about a damaged file, without its advice to unpickle a file it does not recognize."""
    text = first_line(e)
    return "its first bytes are not those of a NumPy file" if "pickle" in text else text
