"""What a trainer chooses of a :class:`loaders.PackedDataset`, in frozen groups; whatever it leaves unset is the
build's own choice, read from the manifest in one place (:meth:`LoaderConfig.resolve`)::

    ds = PackedDataset(
        "build/demo",
        world=World(dp_rank=1, dp_size=8),              # default: World.detect() (torch.distributed, RANK/WORLD_SIZE)
        balance=Balance(window=2),                      # seed, period, slack, micro_batches: the build's
        payload=Payload(fields=("input_ids", "cu_seqlens")),
        reading=Reading(cache_dir="/scratch/weir", verify=True),
    )

- :class:`~loaders.world.World`: this process's DP and CP rank (:mod:`loaders.world`);
- :class:`Balance`: which training steps the build's sequences form and how each is dealt to the DP ranks
  (:mod:`loaders.planner`); each ``None`` is the build's default (:meth:`Balance.resolve`);
- ``cp_split``: how a sequence is cut for the CP ranks (:mod:`loaders.context_parallel`);
- :class:`Payload`: the arrays an item carries (:mod:`loaders.fields`) and how many items are built together;
- :class:`Reading`: where the build's files are cached and whether they are checked (:mod:`loaders.integrity`,
  :mod:`loaders.index`, :mod:`loaders.remote`).

Every group checks its values when made (``ValueError`` naming the value); what depends on the build (a split
that needs ``seq_len`` divisible by ``2·cp_size``) is checked when resolved.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from contract.manifest import BuildInfo, Manifest
from loaders.context_parallel import SPLITS
from loaders.fields import check_fields
from loaders.planner import EDGE_WINDOWS, LAYOUT, LAYOUTS
from loaders.world import World

__all__ = [
    "CHUNK_BYTES",
    "MICRO_BATCHES",
    "Balance",
    "BalanceSettings",
    "LoaderConfig",
    "LoaderSettings",
    "Payload",
    "Reading",
]

MICRO_BATCHES: tuple[str, ...] = get_args(BuildInfo.model_fields["micro_batches"].annotation)  # what a build records
CHUNK_BYTES = 2 << 20  # a chunk's arrays: about this many bytes of int64 each (cache-sized), at most 64 items


@dataclass(frozen=True)
class BalanceSettings:
    """:class:`Balance` resolved against a build, every value set: what :class:`loaders.planner.StepPlanner` is
    made with and what a :class:`loaders.state.LoaderState` records."""

    seed: int
    window: int
    period: int
    slack: float
    micro_batches: str
    layout: int
    edges: int


@dataclass(frozen=True, kw_only=True)
class Balance:
    """The training steps and their deal to DP ranks; ``None``: the build's (the mix file's) choice.

    ``seed`` (build: the mix file's ``seed``): permutes which DP rank reads which balanced share of a step and
    the order of a rank's sequences. ``window`` (≥ 1), ``period`` (≥ 0) and ``slack`` (≥ 0; build: the mix
    file's ``balance.regroup``, else :data:`contract.record.NO_REGROUP`): ``window`` steps regrouped
    together for DP balance (1: the build's steps exactly); ``period``: 0, or the block of steps whose cost
    template regrouping repeats (:func:`loaders.balance.regroup_window`); with both, ``slack`` (0: off) bounds
    the balance a step may give up to keep every ``period``-step window on the build's mixture
    (:mod:`loaders.refinement`). ``micro_batches`` (build: the mix file's ``balance.micro_batches``):
    ``"equal"`` or ``"unequal"`` sequences per DP rank and step (:func:`loaders.balance.assign_unequal`).
    ``layout`` (a build records none: :data:`loaders.planner.LAYOUT`): how a phase's regrouped template is
    ordered where phases meet (:mod:`loaders.order`); 0, the heaviest-first layout of earlier versions,
    resumes a state saved before layouts were named. ``edges`` (≥ 0; a build records none:
    :data:`loaders.planner.EDGE_WINDOWS`, 0 = off): after a phase boundary whose templates do not line up,
    this many regrouped windows (and the phase's last before it) may mix cost classes so that the 10-step
    windows across it keep the plan, at the price of DP balance there (:mod:`loaders.refinement`; the
    trade-off in docs/benchmarks.md).
    """

    seed: int | None = None
    window: int | None = None
    period: int | None = None
    slack: float | None = None
    micro_batches: str | None = None
    layout: int | None = None
    edges: int | None = None

    def __post_init__(self) -> None:
        if self.window is not None and self.window < 1:
            raise ValueError(f"Balance: window must be ≥ 1 step, got {self.window}")
        if self.period is not None and self.period < 0:
            raise ValueError(f"Balance: period must be ≥ 0 steps, got {self.period}")
        if self.slack is not None and not 0 <= self.slack < float("inf"):
            raise ValueError(f"Balance: slack must be a finite number ≥ 0, got {self.slack}")
        if self.micro_batches is not None and self.micro_batches not in MICRO_BATCHES:
            raise ValueError(f"Balance: micro_batches must be one of {MICRO_BATCHES}, got {self.micro_batches!r}")
        if self.layout is not None and self.layout not in LAYOUTS:
            raise ValueError(f"Balance: layout must be one of {LAYOUTS}, got {self.layout}")
        if self.edges is not None and self.edges < 0:
            raise ValueError(f"Balance: edges must be ≥ 0 windows, got {self.edges}")

    def resolve(self, manifest: Manifest) -> BalanceSettings:
        """Every unset value from the build's ``manifest`` (its typed defaults included: seed 0, no regroup,
        ``"equal"`` micro-batches for a build that recorded none)."""
        regroup = manifest.regrouping
        return BalanceSettings(
            seed=manifest.seed if self.seed is None else self.seed,
            window=regroup.window if self.window is None else self.window,
            period=regroup.period if self.period is None else self.period,
            slack=regroup.slack if self.slack is None else self.slack,
            micro_batches=manifest.micro_batches if self.micro_batches is None else self.micro_batches,
            layout=LAYOUT if self.layout is None else self.layout,
            edges=EDGE_WINDOWS if self.edges is None else self.edges,
        )


@dataclass(frozen=True, kw_only=True)
class Payload:
    """What items carry and how they are built. ``fields``: the arrays (default: all of
    :data:`loaders.fields.FIELDS`; a trainer that rebuilds labels and positions on its device,
    :mod:`loaders.targets`, asks for ``("input_ids", "cu_seqlens")`` and the loader writes only those; with
    ``cp_size > 1`` ``labels`` must stay). ``chunk``: items built together (default: about
    :data:`CHUNK_BYTES` per array); it changes speed only, never the items."""

    fields: Sequence[str] | None = None
    chunk: int | None = None

    def __post_init__(self) -> None:
        if self.fields is not None:
            check_fields(self.fields, 1)  # unknown names, a bare string: before the world is known
            object.__setattr__(self, "fields", tuple(self.fields))
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"Payload: chunk must be ≥ 1 item, got {self.chunk}")


@dataclass(frozen=True, kw_only=True)
class Reading:
    """How the build's files are read. ``cache_dir`` (default ``$WEIR_CACHE_DIR``, else ``~/.cache/weir``: a
    training job points it at the node's local disk by the environment, as ``WEIR_WORK_DIR`` for builds): the
    node's index of a local build, the verdicts on checked files, and a streamed build's shards
    (``s3://``/fsspec URIs: at most ``cache_bytes`` of shard files on the node, shared by its processes;
    ``storage_options`` go to fsspec, e.g. ``{"endpoint_url": ...}``; an outage of the store shorter than
    ``outage_s`` seconds is waited out, :mod:`loaders.remote`). ``verify``: every shard file is checked
    against the manifest's size and sha256 before any of its data is used
    (:class:`loaders.integrity.CorruptShardError` names a damaged one); ``False`` trusts the files as they are
    (files fetched from object storage are checked either way)."""

    cache_dir: str | Path | None = None
    cache_bytes: int = 8 << 30
    storage_options: Mapping[str, Any] | None = None
    verify: bool = True
    outage_s: float = 60.0

    def __post_init__(self) -> None:
        if self.cache_bytes < 1:
            raise ValueError(f"Reading: cache_bytes must be ≥ 1, got {self.cache_bytes}")
        if not self.outage_s >= 0:
            raise ValueError(f"Reading: outage_s must be ≥ 0 seconds, got {self.outage_s}")

    @property
    def cache(self) -> Path:
        """The cache folder: ``cache_dir``, else ``$WEIR_CACHE_DIR`` (``~`` expanded), else ``~/.cache/weir``."""
        if self.cache_dir is not None:
            return Path(self.cache_dir)
        return Path(os.environ.get("WEIR_CACHE_DIR") or "~/.cache/weir").expanduser()


@dataclass(frozen=True)
class LoaderSettings:
    """A :class:`LoaderConfig` resolved against a build: ``balance`` (every value set), the checked
    ``cp_split``, ``fields`` (in :data:`~loaders.fields.FIELDS` order) and ``chunk``."""

    balance: BalanceSettings
    cp_split: str
    fields: tuple[str, ...]
    chunk: int


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """Everything a :class:`loaders.PackedDataset` is asked for (see the module's docstring)."""

    world: World
    balance: Balance = Balance()
    cp_split: str = "zigzag"
    payload: Payload = Payload()
    reading: Reading = Reading()

    def __post_init__(self) -> None:
        if self.cp_split not in SPLITS:
            raise ValueError(f"unknown CP split {self.cp_split!r}; expected one of {sorted(SPLITS)}")
        check_fields(self.payload.fields, self.world.cp_size)

    def resolve(self, manifest: Manifest) -> LoaderSettings:
        """The settings for the build whose manifest is ``manifest``: every default the build's own."""
        cp = self.world.cp_size
        if self.cp_split != "zigzag" and manifest.seq_len % (2 * cp):
            # the items cut every split but 'zigzag' by slots that depend on S alone ('thd' too: StepLoader
            # cuts its documents), so S must split into 2·cp equal chunks
            why = "its items cut each sequence as one segment" if self.cp_split == "thd" else "it cuts whole sequences"
            raise ValueError(
                f"sequence length {manifest.seq_len} is not divisible by 2·cp_size {2 * cp} "
                f"(cp_split {self.cp_split!r}: {why}; 'zigzag' cuts each document)"
            )
        chunk = self.payload.chunk
        return LoaderSettings(
            balance=self.balance.resolve(manifest),
            cp_split=self.cp_split,
            fields=check_fields(self.payload.fields, cp),
            chunk=chunk if chunk is not None else max(1, min(64, CHUNK_BYTES // (8 * manifest.seq_len))),
        )
