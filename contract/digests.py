"""Step digests: a 16-byte fingerprint of every step of a build, what ``weir diff`` compares.

A sequence's digest is blake2b-128 over its real tokens (uint32, little-endian) followed by its segments'
lengths (int64, little-endian): the tokens a trainer receives and the document boundaries it masks by, and
nothing of how they are stored (token dtype, shard layout, source names). A step's digest is blake2b-128 over
its sequences' digests in sequence order. Two builds whose step ``t`` digests are equal hand the trainer the
same tokens with the same boundaries at that step (up to a 128-bit collision).

The build writes them to ``shards/step_digests.bin`` (``steps × 16`` bytes, step order), listed in the
manifest's ``step_digests`` with its size and sha256; :func:`read_step_digests` reads them back checked, and
:func:`compute_step_digests` recomputes them from the shards themselves (a build written before digests were
recorded, or a check that the recorded ones are true).
"""

from __future__ import annotations

import hashlib

import numpy as np

from contract.manifest import MANIFEST, ShardError, ShardFile
from contract.shards import ShardSet
from contract.store import Store

__all__ = [
    "DIGEST_BYTES",
    "STEP_DIGESTS",
    "compute_step_digests",
    "first_difference",
    "read_step_digests",
    "sequence_digests",
    "step_digests",
    "write_step_digests",
]

DIGEST_BYTES = 16
STEP_DIGESTS = "step_digests.bin"  # in the shards folder


def _h(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest()


def sequence_digests(tokens: np.ndarray, seg_offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """uint8 [n, 16]: the digest of each of ``n`` sequences, ``tokens`` [n, S] (any integer dtype),
    sequence ``i`` holding the segments ``lengths[seg_offsets[i]:seg_offsets[i+1]]`` (int, at its start)."""
    out = np.zeros((len(tokens), DIGEST_BYTES), np.uint8)
    for i in range(len(tokens)):
        seg = np.asarray(lengths[seg_offsets[i] : seg_offsets[i + 1]], dtype="<i8")
        real = np.asarray(tokens[i, : int(seg.sum())], dtype="<u4")
        out[i] = np.frombuffer(_h(real.tobytes() + seg.tobytes()), np.uint8)
    return out


def step_digests(steps: np.ndarray, seq_digests: np.ndarray, n_steps: int) -> np.ndarray:
    """uint8 [n_steps, 16]: each step's digest from its sequences' ``seq_digests`` [n, 16] (``steps`` int [n],
    non-decreasing); a step without sequences digests the empty string."""
    steps = np.asarray(steps, np.int64)
    bounds = np.searchsorted(steps, np.arange(n_steps + 1))
    out = np.zeros((n_steps, DIGEST_BYTES), np.uint8)
    for t in range(n_steps):
        out[t] = np.frombuffer(_h(seq_digests[bounds[t] : bounds[t + 1]].tobytes()), np.uint8)
    return out


def write_step_digests(store: Store, digests: np.ndarray) -> ShardFile:
    """Write ``digests`` (uint8 [steps, 16]) as :data:`STEP_DIGESTS` in ``store`` (the shards folder); its
    manifest entry."""
    entry = store.put(STEP_DIGESTS, np.ascontiguousarray(digests, np.uint8).tobytes())
    return ShardFile(name=STEP_DIGESTS, bytes=entry["bytes"], sha256=entry["sha256"])


def read_step_digests(shards: ShardSet) -> np.ndarray | None:
    """The recorded step digests of ``shards`` (uint8 [steps, 16]), checked against the manifest's size and
    sha256; None when the build recorded none. Raises :class:`ShardError` (one line) when the file is missing
    or differs."""
    entry = shards.manifest.step_digests
    if entry is None:
        return None
    where = f"{shards.url}/{entry.name}"
    try:
        data = shards.store.read(entry.name)
    except FileNotFoundError:
        raise ShardError(f"{where}: missing ({MANIFEST} lists it)") from None
    if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
        raise ShardError(f"{where}: differs from {MANIFEST}'s size or sha256; the build is damaged, rebuild")
    steps = shards.manifest.steps
    if steps is None or len(data) != steps * DIGEST_BYTES:
        raise ShardError(f"{where}: {len(data)} bytes, not {DIGEST_BYTES} per step of {steps}")
    return np.frombuffer(data, np.uint8).reshape(-1, DIGEST_BYTES)


def compute_step_digests(shards: ShardSet) -> np.ndarray:
    """Every step's digest recomputed from the shards' tokens and segments (reads every shard)."""
    m = shards.manifest
    n_steps = m.steps if m.steps is not None else (int(shards.steps[-1]) + 1 if len(shards) else 0)
    parts = []
    for k in range(len(m.shards)):
        meta = shards.shard_meta(k)
        parts.append(sequence_digests(shards.shard_tokens(k), meta["seg_offsets"], meta["segments"][:, 3]))
    seq = np.concatenate(parts) if parts else np.zeros((0, DIGEST_BYTES), np.uint8)
    return step_digests(shards.steps, seq, n_steps)


def first_difference(a: np.ndarray, b: np.ndarray) -> int | None:
    """The first step whose digest differs between ``a`` and ``b`` (uint8 [steps, 16] each), the shorter
    one's length when one is a prefix of the other, None when they are equal."""
    n = min(len(a), len(b))
    diff = np.flatnonzero((a[:n] != b[:n]).any(axis=1))
    if len(diff):
        return int(diff[0])
    return None if len(a) == len(b) else n
