"""The training side of weir: read packed builds as a torch ``IterableDataset``. Never imports Dagster."""

from loaders.dataset import IGNORE_INDEX, PackedDataset
from loaders.loader import PackedLoader
from loaders.state import LoaderState, StateError
from loaders.world import World

__all__ = ["IGNORE_INDEX", "LoaderState", "PackedDataset", "PackedLoader", "StateError", "World"]
