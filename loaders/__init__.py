"""The training side of weir: read packed builds as a torch ``IterableDataset``. Never imports Dagster."""

from loaders.dataset import PackedDataset
from loaders.fields import FIELDS, IGNORE_INDEX, FieldsError
from loaders.loader import PackedLoader
from loaders.state import LoaderState, StateError
from loaders.world import World

__all__ = [
    "FIELDS",
    "IGNORE_INDEX",
    "FieldsError",
    "LoaderState",
    "PackedDataset",
    "PackedLoader",
    "StateError",
    "World",
]
