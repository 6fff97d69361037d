"""The training side of weir: read packed builds as a torch ``IterableDataset``. Never imports Dagster."""

from loaders.dataset import ExhaustedError, PackedDataset
from loaders.facts import RunFacts
from loaders.fields import FIELDS, IGNORE_INDEX, FieldsError
from loaders.loader import PackedLoader
from loaders.state import LoaderState, StateError
from loaders.steps import Step, StepLoader
from loaders.world import World

__all__ = [
    "FIELDS",
    "IGNORE_INDEX",
    "ExhaustedError",
    "FieldsError",
    "LoaderState",
    "PackedDataset",
    "PackedLoader",
    "RunFacts",
    "StateError",
    "Step",
    "StepLoader",
    "World",
]
