"""``PackedDataset``: the packed token stream of a weir build as a torch ``IterableDataset``.

Training code imports this (and never Dagster)::

    from loaders import Balance, PackedDataset, PackedLoader, Payload, World
    ds = PackedDataset("build/demo", world=World.detect(cp_size=2))  # ranks from torch.distributed or RANK/WORLD_SIZE
    loader = PackedLoader(ds, num_workers=2, pin_memory=True)
    for item in loader: ...
    # cp_size 1, labels and positions made on the GPU (loaders.targets): the loader writes 8 bytes per token
    lean = PackedDataset("build/demo", payload=Payload(fields=("input_ids", "cu_seqlens")))
    ckpt["loader"] = loader.state_dict()                  # exact, also with workers; elastic across worlds
    ds.facts.steps, ds.facts.vocab_size, ds.facts.pad_id  # the run's facts (loaders.facts), typed

What it can be asked, and the build's defaults: :mod:`loaders.config`. One optimizer step at a time (stacked
or variable-length micro-batches): :mod:`loaders.steps`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from contract.errors import WeirError
from loaders.config import Balance, LoaderConfig, Payload, Reading
from loaders.facts import RunFacts
from loaders.feed import feed_for
from loaders.fields import FIELDS, IGNORE_INDEX
from loaders.index import open_index
from loaders.integrity import VerifiedShardSet, verifier_for
from loaders.items import ItemBuilder
from loaders.state import LoaderState, StateError
from loaders.stream import settings_planner
from loaders.switch import switch_limit
from loaders.world import World

__all__ = ["FIELDS", "IGNORE_INDEX", "SHARED_CONTEXTS", "ExhaustedError", "PackedDataset"]

SHARED_CONTEXTS = "_planner_contexts"  # key of what a worker passes to PackedLoader (which removes it)


class ExhaustedError(WeirError, RuntimeError):
    """Iterating a loader whose position is past the build's last step (a second pass, which would be empty)."""


class PackedDataset(IterableDataset[dict[str, Any]]):
    """Yields, in step order, one dict per packed sequence this DP rank reads, cut for this CP rank.

    ``path``: a build folder, its ``shards`` folder, or an ``s3://``/fsspec URI of either (streamed through a
    local cache, see :mod:`loaders.remote`). The rest is keyword-only, in the groups of :mod:`loaders.config`:
    ``world`` (default :meth:`World.detect`), ``balance`` (each unset value the build's), ``cp_split``
    (``"zigzag"``: per document, balanced; ``"sequence_zigzag"`` or ``"contiguous"``), ``payload`` (fields,
    chunk) and ``reading`` (cache, object storage, verification). They are kept as given in :attr:`config`
    and resolved against the build in :attr:`settings`; :attr:`world` is this process's place.

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
      Python ints, whatever the payload's ``fields``.
    - only when asked by name in the payload's ``fields`` (:data:`~loaders.fields.PROVENANCE_FIELDS`), where
      the tokens came from: ``source_ids`` int32 [n] (each slot's source index, -1 on padding), and per
      segment of ``cu_seqlens`` ``segments`` int64 [k, 3] (source index, document id, offset of the segment's
      first token in its document; a row of -1 for the trailing padding); source names: ``facts.sources``;
      a loss per source: :mod:`loaders.provenance`.

    With ``micro_batches == "unequal"`` count a rank's items per step by their ``step`` and normalize the
    loss by tokens. Treat items as read-only: the tensors are views of arrays shared by a chunk of items
    (reused once none of them is referenced) and ``indices`` may be one tensor shared by all items. A local
    and a streamed build of the same data give the same items (one builder, :mod:`loaders.items`).

    ``facts``: the run's facts (:class:`loaders.facts.RunFacts`: steps, seq_len, vocab_size, eos_id, pad_id,
    sources, …).

    One pass is the whole training run: iterating again once every step was read raises
    :class:`ExhaustedError` (it would silently yield nothing); :meth:`rewind` starts another pass on purpose.

    Deterministic for the same build, balance and world. ``state_dict()`` after n items (iterated in
    this process) and ``load_state_dict()`` on a fresh dataset continue with item n+1; with DataLoader
    workers use :class:`loaders.loader.PackedLoader`, whose state counts what the consumer received.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        world: World | None = None,
        balance: Balance = Balance(),
        cp_split: str = "zigzag",
        payload: Payload = Payload(),
        reading: Reading = Reading(),
    ) -> None:
        super().__init__()
        world = world if world is not None else World.detect()
        self.config = LoaderConfig(world=world, balance=balance, cp_split=cp_split, payload=payload, reading=reading)
        self.world = world
        self.shards, manifest_bytes = _open(path, reading)
        m = self.shards.manifest
        self.settings = self.config.resolve(m)
        b = self.settings.balance
        self.planner = settings_planner(self.shards, b)
        self.planner.check_world(world.dp_size)
        self.facts = RunFacts.from_manifest(m, self.planner.steps, int(self.shards.seq_tokens.sum()))
        self.build_id = hashlib.sha256(manifest_bytes).hexdigest()
        self._step, self._consumed = 0, 0  # position: next item to yield
        self._feed = feed_for(self.shards)
        self._builder = ItemBuilder(
            self._feed,
            seq_len=m.seq_len,
            pad_id=m.pad_id,
            fields=self.settings.fields,
            world=world,
            cp_split=self.settings.cp_split,
        )

    @property
    def per_rank(self) -> int:
        """Sequences each DP rank reads per step (on average when ``micro_batches == "unequal"``)."""
        return self.planner.global_batch // self.world.dp_size

    def count(self, step: int) -> int:
        """Sequences this DP rank reads in training ``step`` (``per_rank`` unless ``micro_batches == "unequal"``)."""
        return self.planner.count(step, self.world.dp_size, self.world.dp_rank)

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
        if self.settings.balance.micro_batches == "equal":
            return (self.planner.steps - self._step) * self.per_rank - self._consumed
        counts = (self.count(t) for t in range(self._step, self.planner.steps))
        return sum(counts) - self._consumed

    def assignments(self) -> Iterator[tuple[int, int, int]]:
        """``(step, slot, sequence)`` of every remaining item of this rank, in order (no I/O beyond metadata)."""
        step0, consumed0 = self._step, self._consumed  # iteration moves the position
        dp_size, dp_rank = self.world.dp_size, self.world.dp_rank
        for t in range(step0, self.planner.steps):
            mine = self.planner.assignment(t, dp_size)[dp_rank].tolist()
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
        per_rank, equal = self.per_rank, self.settings.balance.micro_batches == "equal"
        share = info is not None and bool(self.planner.slack)  # see StepPlanner.shared_contexts
        shared_step = -1  # once per step is enough: the main process keeps what it was given
        # items are built a chunk at a time (one numpy call per array for all of them, not per item)
        for chunk in self._feed.chunks(mine, self.settings.chunk):
            for (t, slot, _), item in zip(chunk, self.items([i for *_, i in chunk]), strict=True):
                item["step"], item["slot"] = t, slot
                if info is None and equal:  # the position moves just past this item (as _advance, inlined)
                    self._step, self._consumed = (t + 1, 0) if slot + 1 == per_rank else (t, slot + 1)
                elif info is None:
                    self._advance(t, slot)
                if share and t != shared_step:
                    item[SHARED_CONTEXTS], shared_step = self.planner.shared_contexts(t), t
                yield item

    def items(self, seqs: list[int]) -> list[dict[str, Any]]:
        """Global sequences ``seqs`` cut for this CP rank (without ``step``/``slot``; ``step`` is the build's),
        built together by :class:`loaders.items.ItemBuilder`."""
        return self._builder.build(seqs)

    def item(self, i: int) -> dict[str, Any]:
        """Global sequence ``i`` cut for this CP rank, as :meth:`items` builds it."""
        return self.items([i])[0]

    def _advance(self, step: int, slot: int) -> None:
        """Record that item ``(step, slot)`` was delivered: the position moves just past it."""
        last = slot + 1 == self.count(step)
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
        b = self.settings.balance
        return LoaderState(
            build_id=self.build_id,
            seed=b.seed,
            window=b.window,
            period=b.period,
            micro_batches=b.micro_batches,
            slack=self.planner.slack,  # 0 when this planner refines nothing
            layout=self.planner.layout,  # 0 where the layouts are alike
            edges=self.planner.edge_windows,  # 0 where nothing is refined or no boundary
            context=context,
            step=self._step,
            consumed=self._consumed,
            dp_rank=self.world.dp_rank,
            dp_size=self.world.dp_size,
            cp_size=self.world.cp_size,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue at the next unseen sequence of ``state``; a state saved on a build this one continues
        switches here up to its switch step (:func:`loaders.switch.switch_limit`). Raises
        :class:`~loaders.state.StateError` for a state of another build or plan, one saved past the switch, one
        saved inside a step under another DP layout, or a position this build does not have (a step past its end, more
        sequences delivered than the step gives this rank)."""
        s = LoaderState.from_dict(state)
        if s.build_id != self.build_id:  # saved on a build this one continues (loaders.switch)?
            limit = switch_limit(self.shards.manifest, s.build_id, s.window, s.edges)
            if limit is not None and (s.step > limit or (s.step == limit and s.consumed)):
                at = [e.at for e in self.shards.manifest.lineage if e.base == s.build_id][-1]
                raise StateError(
                    f"loader state is at step {s.step} of the build this one continues at step {at}; it switches only "
                    f"from a step boundary at or before step {limit} (resume on the base, or from an earlier state)"
                )
            if limit is not None:
                s = dataclasses.replace(s, build_id=self.build_id)
        s.check(self._state())
        steps = self.planner.steps
        if s.step > steps:
            raise StateError(f"loader state is at step {s.step}; this build has {steps} training steps")
        if s.consumed and (s.step == steps or s.consumed >= self.count(s.step)):
            n = 0 if s.step == steps else self.count(s.step)
            raise StateError(
                f"loader state has {s.consumed} sequences of step {s.step} delivered; this rank reads {n} there"
            )
        try:
            self.planner.seed_context(s.step, s.context)
        except ValueError as e:
            raise StateError(f"loader state's context does not fit this build's planner: {e}") from None
        self._step, self._consumed = s.step, s.consumed


def _open(path: str | Path, reading: Reading) -> tuple[VerifiedShardSet, bytes]:
    """The build's shards and the manifest's bytes (the build's identity)."""
    verifier = verifier_for(reading.verify, reading.cache)
    if isinstance(path, str) and "://" in path and not path.startswith("file://"):
        from loaders.remote import open_remote

        return open_remote(
            path, reading.cache, reading.cache_bytes, reading.storage_options, verifier, reading.outage_s
        )
    root = Path(str(path).removeprefix("file://"))
    shards = VerifiedShardSet(root / "shards" if (root / "shards" / "manifest.json").exists() else root, verifier)
    open_index(shards, reading.cache)
    return shards, shards.manifest_bytes
