"""The training side of weir: read packed builds as a torch ``IterableDataset``. Never imports Dagster.

Layers, each module importing only those drawn under it (and the build contract, :mod:`contract`, under
them all; never the factory, :mod:`mixing`)::

    loader · steps · varlen        PackedLoader, StepLoader, by_step: what a trainer iterates
    dataset                        PackedDataset: opens the build, plans its steps, builds items, keeps the position
    ├─ config                      what the trainer asked (world, balance, cp_split, payload, reading), resolved
    │                              against the manifest: LoaderConfig.resolve → LoaderSettings
    ├─ planner                     training steps and their deal to DP ranks, from the resolved balance
    │  └─ balance · refinement     regrouping and rank assignment; a window kept on the build's mixture
    ├─ items                       ItemBuilder: a chunk of items cut for this CP rank (context_parallel, fields)
    │  └─ feed                     their tokens and segments: a local build's index, or a streamed one's views
    ├─ index · remote              the node's index of a local build; a build streamed from object storage
    │  └─ integrity                every file checked against the manifest before its data is used
    └─ facts · state               the run's facts (RunFacts); the resumable position (LoaderState)
    world · fields · context_parallel   leaves: the DP × CP grid; item fields; the CP splits
    stream (config, planner)       the trainer's mixture, for a build's report; targets (fields): on the device
    provenance (fields)            the loss per source, on the device, from the items' source_ids
"""

from loaders.config import Balance, LoaderConfig, Payload, Reading
from loaders.dataset import ExhaustedError, PackedDataset
from loaders.facts import RunFacts
from loaders.fields import FIELDS, IGNORE_INDEX, PROVENANCE_FIELDS, SEGMENT_COLUMNS, FieldsError
from loaders.loader import PackedLoader, WorkerKilledError
from loaders.state import LoaderState, StateError
from loaders.steps import Step, StepLoader
from loaders.world import World

__all__ = [
    "FIELDS",
    "IGNORE_INDEX",
    "PROVENANCE_FIELDS",
    "SEGMENT_COLUMNS",
    "Balance",
    "ExhaustedError",
    "FieldsError",
    "LoaderConfig",
    "LoaderState",
    "PackedDataset",
    "PackedLoader",
    "Payload",
    "Reading",
    "RunFacts",
    "StateError",
    "Step",
    "StepLoader",
    "WorkerKilledError",
    "World",
]
