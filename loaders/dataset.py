"""``PackedDataset``: the packed token stream of a weir build as a torch ``IterableDataset``.

Training code imports this (and never Dagster)::

    from loaders import PackedDataset, PackedLoader
    ds = PackedDataset("build/demo", cp_size=2)            # dp/cp ranks from torch.distributed or RANK/WORLD_SIZE
    loader = PackedLoader(ds, num_workers=2, pin_memory=True)
    for item in loader: ...
    # cp_size 1, labels and positions made on the GPU (loaders.targets): the loader writes 8 bytes per token
    lean = PackedDataset("build/demo", fields=("input_ids", "cu_seqlens"))
    ckpt["loader"] = loader.state_dict()                  # exact, also with workers; elastic across worlds
    ds.facts.steps, ds.facts.vocab_size, ds.facts.pad_id  # the run's facts (loaders.facts), typed

One optimizer step at a time (stacked or variable-length micro-batches): :mod:`loaders.steps`.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loaders.chunk import ChunkBuilder
from loaders.context_parallel import split
from loaders.facts import RunFacts
from loaders.fields import FIELDS, IGNORE_INDEX, check_fields
from loaders.index import open_index
from loaders.integrity import VerifiedShardSet, verifier_for
from loaders.planner import StepPlanner
from loaders.state import LoaderState, StateError
from loaders.world import World
from mixing.errors import WeirError

__all__ = ["FIELDS", "IGNORE_INDEX", "SHARED_CONTEXTS", "ExhaustedError", "PackedDataset"]

SHARED_CONTEXTS = "_planner_contexts"  # key of what a worker passes to PackedLoader (which removes it)


class ExhaustedError(WeirError, RuntimeError):
    """Iterating a loader whose position is past the build's last step (a second pass, which would be empty)."""


class PackedDataset(IterableDataset[dict[str, Any]]):
    """Yields, in step order, one dict per packed sequence this DP rank reads, cut for this CP rank.

    ``path``: a build folder, its ``shards`` folder, or an ``s3://``/fsspec URI of either (streamed through a
    local cache of at most ``cache_bytes`` per process, see :mod:`loaders.remote`; ``storage_options`` go to
    fsspec, e.g. ``{"endpoint_url": ...}``). World: the arguments, or
    :meth:`World.detect` when ``dp_rank``/``dp_size`` are None. ``window``, ``period``, ``slack``: default
    to the mix file's ``balance.regroup`` (else :data:`mixing.format.manifest.NO_REGROUP`). ``window``: steps
    regrouped together for DP balance (1 = the build's steps exactly); ``period``: 0, or the block of steps
    whose cost template regrouping repeats (10 with ``window=20`` for one sequence per rank at long context,
    see :func:`loaders.balance.regroup_window`); with both, ``slack`` (0 turns it off) bounds the balance a
    step may give up to the refinement that keeps every ``period``-step window on the build's mixture
    (:mod:`loaders.refinement`).
    ``micro_batches``: ``"equal"`` or ``"unequal"`` sequences per DP rank and step (default: the mix file's
    ``balance.micro_batches``, see :func:`loaders.balance.assign_unequal`; with ``"unequal"`` count a
    rank's items per step by their ``step`` and normalize the loss by tokens).
    ``cp_split``: ``"zigzag"`` (per document, balanced), ``"sequence_zigzag"`` or ``"contiguous"``.
    ``chunk``: items built together from a local build (default: about 2 MiB of int64 per array); it
    changes speed only, never the items. ``fields``: the arrays items carry (default: all of
    :data:`loaders.fields.FIELDS`); a trainer that rebuilds labels and positions on its device
    (:mod:`loaders.targets`) asks for ``("input_ids", "cu_seqlens")`` and the loader writes only those.
    With ``cp_size > 1`` ``labels`` must stay (a CP chunk's last label is a token another CP rank holds).
    ``verify`` (default True): every shard file is checked against the manifest's size and sha256 before
    any of its data is used, raising :class:`loaders.integrity.CorruptShardError` naming a damaged one;
    hashed in the background ahead of the reader, once per node (verdicts cached under ``cache_dir``,
    default ``~/.cache/weir``), see :mod:`loaders.integrity`. ``verify=False`` trusts the files as they are
    (files fetched from object storage are checked on download either way).

    Items (torch tensors, ``n`` slots for this CP rank; ``n = S`` when ``cp_size == 1``):

    - ``input_ids`` int64 [n] (``pad_id`` in padding slots), ``labels`` int64 [n] (next token inside the
      same document, else -100), ``position_ids`` int64 [n] (0-based inside the document; the trailing
      padding is a segment of its own and counts 0, 1, …; CP padding slots, ``indices == -1``, hold 0),
    - ``indices`` int64 [n]: position of each slot in the full sequence, -1 for CP padding,
    - ``cu_seqlens`` int32 [k+1]: the full sequence's k segments (trailing padding is its own segment),
    - ``cu_seqlens_padded`` int32 [k+1]: the same with each segment padded for the CP split (a multiple of
      2·cp for ``"zigzag"``; equal to ``cu_seqlens`` otherwise); each rank holds ``[-1] / cp`` slots,
    - ``step`` (training step), ``slot`` (index among this rank's sequences of the step), ``sequence``
      (global index in the build), ``num_tokens`` (real tokens of the full sequence; padding follows):
      Python ints, whatever ``fields``.

    Treat items as read-only: the tensors are views of arrays shared by a chunk of items (reused once none
    of them is referenced) and ``indices`` may be one tensor shared by all items.

    ``seed`` (default: the mix file's ``seed``, recorded in the manifest; 0 for builds that lack it) permutes
    which DP rank reads which balanced share of a step and the order of a rank's sequences.
    ``facts``: the run's facts (:class:`loaders.facts.RunFacts`: steps, vocab_size, eos_id, pad_id, …).

    One pass is the whole training run: iterating again once every step was read raises
    :class:`ExhaustedError` (it would silently yield nothing); :meth:`rewind` starts another pass on purpose.

    Deterministic for the same build, seed, window and world. ``state_dict()`` after n items (iterated in
    this process) and ``load_state_dict()`` on a fresh dataset continue with item n+1; with DataLoader
    workers use :class:`loaders.loader.PackedLoader`, whose state counts what the consumer received.
    """

    def __init__(
        self,
        path: str | Path,
        dp_rank: int | None = None,
        dp_size: int | None = None,
        cp_rank: int | None = None,
        cp_size: int = 1,
        seed: int | None = None,
        *,
        window: int | None = None,
        period: int | None = None,
        slack: float | None = None,
        micro_batches: str | None = None,
        chunk: int | None = None,
        cp_split: str = "zigzag",
        fields: tuple[str, ...] | list[str] | None = None,
        cache_dir: str | Path | None = None,
        cache_bytes: int = 8 << 30,
        storage_options: dict[str, Any] | None = None,
        verify: bool = True,
    ) -> None:
        super().__init__()
        if dp_rank is None or dp_size is None:
            detected = World.detect(cp_size)
            dp_rank = detected.dp_rank if dp_rank is None else dp_rank
            dp_size = detected.dp_size if dp_size is None else dp_size
            cp_rank = detected.cp_rank if cp_rank is None else cp_rank
        self.world = World(dp_rank, dp_size, cp_rank or 0, cp_size)
        self.fields = check_fields(fields, cp_size)
        self.shards, manifest_bytes = _open(path, cache_dir, cache_bytes, storage_options, verify)
        m = self.shards.manifest
        self.seq_len, self.pad_id = m.seq_len, m.pad_id
        if cp_split != "zigzag" and self.seq_len % (2 * cp_size):
            raise ValueError(f"sequence length {self.seq_len} is not divisible by 2·cp_size {2 * cp_size}")
        split(np.array([2 * cp_size]), cp_size, 0, cp_split)  # validates the name early
        regroup = m.regrouping  # the mix file's balance.regroup: the defaults of the three below
        window = regroup.window if window is None else window
        period = regroup.period if period is None else period
        slack = regroup.slack if slack is None else slack
        seed = m.seed if seed is None else seed
        self.seed, self.window, self.cp_split = seed, window, cp_split
        self.period = period
        self.micro_batches = micro_batches or m.micro_batches
        self.planner = StepPlanner(self.shards, window, seed, period, self.micro_batches, slack)
        self.global_batch = self.planner.global_batch
        self.planner.check_world(dp_size)
        self.facts = RunFacts.from_manifest(m, self.planner.steps, int(self.shards.seq_tokens.sum()))
        self.build_id = hashlib.sha256(manifest_bytes).hexdigest()
        self._step, self._consumed = 0, 0  # position: next item to yield
        # items built together: ~2 MiB per array (cache-sized), at most 64 items
        self.chunk = max(1, chunk if chunk is not None else min(64, (2 << 20) // (8 * self.seq_len)))
        self._chunks = ChunkBuilder(self.shards, self.fields, cp_size, self.cp_rank, cp_split, self.pad_id)

    # compatibility with the skeleton's attribute names
    dp_rank = property(lambda self: self.world.dp_rank)
    dp_size = property(lambda self: self.world.dp_size)
    cp_rank = property(lambda self: self.world.cp_rank)
    cp_size = property(lambda self: self.world.cp_size)

    @property
    def per_rank(self) -> int:
        """Sequences each DP rank reads per step (on average when ``micro_batches == "unequal"``)."""
        return self.global_batch // self.dp_size

    def count(self, step: int) -> int:
        """Sequences this DP rank reads in training ``step`` (``per_rank`` unless ``micro_batches == "unequal"``)."""
        return self.planner.count(step, self.dp_size, self.dp_rank)

    @property
    def exhausted(self) -> bool:
        """True once every step was read (the position is past the last step of a non-empty build)."""
        return 0 < self.planner.steps <= self._step

    def rewind(self) -> None:
        """Start another pass over the whole build, from step 0 (a run trained on the build twice)."""
        self._step, self._consumed = 0, 0

    def check_not_exhausted(self) -> None:
        """Raise :class:`ExhaustedError` when :attr:`exhausted` (what ``iter`` does first)."""
        if self.exhausted:
            raise ExhaustedError(
                f"{self.shards.url}: all {self.planner.steps} steps of this build were already read; a build is one "
                "pass of the training run, so another pass would be empty: call rewind() to read it again from "
                "step 0, or load_state_dict() a saved state"
            )

    def __len__(self) -> int:
        if self.micro_batches == "equal":
            return (self.planner.steps - self._step) * self.per_rank - self._consumed
        counts = (self.planner.count(t, self.dp_size, self.dp_rank) for t in range(self._step, self.planner.steps))
        return sum(counts) - self._consumed

    def assignments(self) -> Iterator[tuple[int, int, int]]:
        """``(step, slot, sequence)`` of every remaining item of this rank, in order (no I/O beyond metadata)."""
        step0, consumed0 = self._step, self._consumed  # iteration moves the position
        for t in range(step0, self.planner.steps):
            mine = self.planner.assignment(t, self.dp_size)[self.dp_rank].tolist()
            for slot in range(consumed0 if t == step0 else 0, len(mine)):
                yield t, slot, mine[slot]

    def rank_sequences(self) -> np.ndarray:
        """Global sequence indices this DP rank reads from its position on, in order (int64)."""
        return np.array([s for _, _, s in self.assignments()], dtype=np.int64)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        self.check_not_exhausted()
        info = get_worker_info()
        stride, offset = (1, 0) if info is None else (info.num_workers, info.id)
        mine = itertools.islice(self.assignments(), offset, None, stride)  # worker w: items w, w + stride, …
        per_rank, equal = self.per_rank, self.micro_batches == "equal"
        # a local build: its whole segment index is cheap to load (a remote one would fetch every shard)
        whole = not self.shards.streamed
        share = info is not None and bool(self.planner.slack)  # see StepPlanner.shared_contexts
        shared_step = -1  # once per step is enough: the main process keeps what it was given
        while chunk := list(itertools.islice(mine, self.chunk)):
            # items are built a chunk at a time (one numpy call per array for all of them, not per item)
            built = self.items([i for _, _, i in chunk]) if whole else (self.item(i) for *_, i in chunk)
            for (t, slot, _), item in zip(chunk, built, strict=True):
                item["step"], item["slot"] = t, slot
                if info is None and equal:  # the position moves just past this item (as _advance, inlined)
                    self._step, self._consumed = (t + 1, 0) if slot + 1 == per_rank else (t, slot + 1)
                elif info is None:
                    self._advance(t, slot)
                if share and t != shared_step:
                    item[SHARED_CONTEXTS], shared_step = self.planner.shared_contexts(t), t
                yield item

    def items(self, seqs: list[int]) -> list[dict[str, Any]]:
        """Global sequences ``seqs`` cut for this CP rank, identical to :meth:`item`'s (without ``step``/``slot``;
        built together by :class:`loaders.chunk.ChunkBuilder` from the local build's segment index)."""
        return self._chunks.build(seqs)

    def item(self, i: int) -> dict[str, Any]:
        """Global sequence ``i`` cut for this CP rank (without ``step``/``slot``)."""
        view = self.shards.verified_sequence(i)
        S = self.seq_len
        lens = np.asarray(view.segments[:, 3], dtype=np.int64)
        used = int(lens.sum())
        seg_lens = np.append(lens, S - used) if used < S else lens
        cu = np.concatenate([[0], np.cumsum(seg_lens)])
        # one extra slot at the end holds the padding value, so that index -1 (CP padding) gathers it
        tokens = np.empty(S + 1, dtype=np.int64)
        tokens[:S] = view.tokens
        tokens[S] = self.pad_id
        labels = np.empty(S + 1, dtype=np.int64)
        labels[: S - 1] = tokens[1:S]
        labels[cu[1:] - 1] = IGNORE_INDEX  # the last token of each document predicts nothing
        labels[used:] = IGNORE_INDEX
        position_ids = np.zeros(S + 1, dtype=np.int64)
        position_ids[:S] = np.arange(S) - np.repeat(cu[:-1], seg_lens)
        if self.cp_size == 1:
            idx = np.arange(S, dtype=np.int64)
            x, y, pos = tokens[:S], labels[:S], position_ids[:S]
        else:
            idx = split(seg_lens, self.cp_size, self.cp_rank, self.cp_split)
            x, y, pos = tokens[idx], labels[idx], position_ids[idx]
        padded = cu
        if self.cp_split == "zigzag" and self.cp_size > 1:
            two = 2 * self.cp_size
            padded = np.concatenate([[0], np.cumsum(-(-seg_lens // two) * two)])
        arrays = {
            "input_ids": lambda: torch.from_numpy(np.ascontiguousarray(x)),
            "labels": lambda: torch.from_numpy(np.ascontiguousarray(y)),
            "position_ids": lambda: torch.from_numpy(np.ascontiguousarray(pos)),
            "indices": lambda: torch.from_numpy(idx),
            "cu_seqlens": lambda: torch.from_numpy(cu.astype(np.int32)),
            "cu_seqlens_padded": lambda: torch.from_numpy(padded.astype(np.int32)),
        }
        out: dict[str, Any] = {name: arrays[name]() for name in self.fields}
        return {**out, "step": view.step, "sequence": i, "num_tokens": used}

    def _advance(self, step: int, slot: int) -> None:
        """Record that item ``(step, slot)`` was delivered: the position moves just past it."""
        last = slot + 1 == self.planner.count(step, self.dp_size, self.dp_rank)
        self._step, self._consumed = (step + 1, 0) if last else (step, slot + 1)

    def state_at(self, step: int, slot: int) -> dict[str, Any]:
        """The state just after item ``(step, slot)`` was delivered (what :class:`PackedLoader` saves); with
        ``slot == -1``, the state at the start of ``step`` (a step boundary: it resumes on any world)."""
        saved = (self._step, self._consumed)
        try:
            self._advance(step, slot)
            return self.state_dict()
        finally:
            self._step, self._consumed = saved

    def state_dict(self) -> dict[str, Any]:
        """World-independent position (see :mod:`loaders.state`): resume on this build, any world at a step
        boundary, the same DP layout inside a step."""
        return self._state(context=self.planner.context_at(self._step)).to_dict()

    def _state(self, context: list[list[int]] | None = None) -> LoaderState:
        return LoaderState(
            build_id=self.build_id,
            seed=self.seed,
            window=self.window,
            period=self.period,
            micro_batches=self.micro_batches,
            slack=self.planner.slack,
            context=context,
            step=self._step,
            consumed=self._consumed,
            dp_rank=self.dp_rank,
            dp_size=self.dp_size,
            cp_size=self.cp_size,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the next unseen sequence of ``state``; raises :class:`~loaders.state.StateError` for
        a state of another build or plan, or one saved inside a step under another DP layout."""
        s = LoaderState.from_dict(state)
        s.check(self._state())
        try:
            self.planner.seed_context(s.step, s.context)
        except ValueError as e:
            raise StateError(f"loader state's context does not fit this build's planner: {e}") from None
        self._step, self._consumed = s.step, s.consumed


def _open(
    path: str | Path,
    cache_dir: str | Path | None,
    cache_bytes: int,
    storage_options: dict[str, Any] | None,
    verify: bool,
) -> tuple[VerifiedShardSet, bytes]:
    """The build's shards and the manifest's bytes (the build's identity)."""
    verifier = verifier_for(verify, cache_dir)
    if isinstance(path, str) and "://" in path and not path.startswith("file://"):
        from loaders.remote import open_remote

        return open_remote(path, cache_dir, cache_bytes, storage_options, verifier)
    root = Path(str(path).removeprefix("file://"))
    shards = VerifiedShardSet(root / "shards" if (root / "shards" / "manifest.json").exists() else root, verifier)
    open_index(shards, Path(cache_dir) if cache_dir is not None else Path.home() / ".cache" / "weir")
    return shards, shards.manifest_bytes
