"""One stage of a build: :class:`Stage`, its row in :data:`mixing.stages.STAGES` (name, partitioning, deps,
function, and how a driver runs that function for one partition), and the commit protocol every stage
function keeps in the build folder.

The protocol: a stage function first calls :func:`begin`, which withdraws the stage's commit record
(:mod:`mixing.output.commit`) before any of its outputs change; it then writes its small files under
``layout.root`` and ends with :func:`publish`, which copies them to the build root (``layout.url``; nothing
to copy when that is ``layout.root`` itself) and writes the commit record there last, listing them (bytes,
sha256) and the entries its workers already published. So a run killed at any moment leaves no record of the
stage, never one that lists a half-written file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from contract.store import sha256_file
from mixing.engine import LOCAL, Engine
from mixing.mixfile.mix import Mix
from mixing.output.commit import commit, uncommit
from mixing.output.layout import BuildLayout

__all__ = ["Stage", "StorageOptions", "begin", "publish"]

StorageOptions = dict[str, Any] | None  # fsspec options (s3 endpoint, credentials) from the Dagster resource


def begin(layout: BuildLayout, stage: str, partition: str | None = None) -> None:
    """Withdraw ``stage``'s commit record: its outputs are about to change."""
    layout.root.mkdir(parents=True, exist_ok=True)
    uncommit(layout.store(), stage, partition)


def publish(
    layout: BuildLayout, stage: str, partition: str | None, names: list[str], published: Iterable[dict[str, Any]] = ()
) -> None:
    """Copy the files ``names`` (relative to ``layout.root``) to the build root when it is elsewhere, then write
    the stage's commit record listing them and the entries already ``published`` there by workers."""
    store = layout.store()
    files = list(published)
    for name in names:
        local = layout.root / name
        if layout.target:
            files.append(store.put_file(name, local))
        else:
            files.append({"name": name, "bytes": local.stat().st_size, "sha256": sha256_file(local)})
    commit(store, stage, partition, files)


@dataclass(frozen=True)
class Stage:
    """One stage of a build: the asset ``[<mix name>, name]`` and the function that computes it.

    ``per_source``: partitioned by source name, run once per source (sorted); else once for the whole mix.
    ``deps``: the stages whose outputs it reads, all earlier in :data:`mixing.stages.STAGES`. ``reads_sources``:
    it reads the sources' files, so ``fn`` takes the fsspec ``storage_options``. ``fans_out``: ``fn`` takes the
    ``engine`` that runs its work items (:mod:`mixing.engine`). ``ahead``: starts every partition's work
    items on the engine before the first run (:meth:`run_ahead`), for a driver that runs the partitions one
    after another in one process.
    """

    name: str
    per_source: bool
    deps: tuple[str, ...]
    fn: Callable[..., object]
    reads_sources: bool = False
    fans_out: bool = False
    ahead: Callable[..., int] | None = None

    def partitions(self, mix: Mix) -> list[str | None]:
        """The runs of this stage: each source name (sorted) if ``per_source``, else one run (``None``)."""
        return [*sorted(mix.sources)] if self.per_source else [None]

    def run(
        self,
        mix: Mix,
        layout: BuildLayout,
        source: str | None = None,
        storage_options: StorageOptions = None,
        engine: Engine = LOCAL,
    ) -> object:
        """Run ``fn`` for one partition (``source`` for a per-source stage, else ``None``); return its summary."""
        if (source is not None) != self.per_source:
            raise ValueError(f"stage {self.name!r} runs {'per source' if self.per_source else 'once'}: {source=}")
        args = (mix, layout, source) if self.per_source else (mix, layout)
        kwargs: dict[str, Any] = {"storage_options": storage_options} if self.reads_sources else {}
        return self.fn(*args, **kwargs, **({"engine": engine} if self.fans_out else {}))

    def run_ahead(
        self, mix: Mix, layout: BuildLayout, storage_options: StorageOptions = None, engine: Engine = LOCAL
    ) -> int:
        """Start every partition's work items on ``engine`` now, for the runs that follow in this process to
        collect (:mod:`mixing.engine`); the tasks started (0 without ``ahead`` or on the local engine)."""
        if self.ahead is None:
            return 0
        kwargs: dict[str, Any] = {"storage_options": storage_options} if self.reads_sources else {}
        return self.ahead(mix, layout, **kwargs, engine=engine)
