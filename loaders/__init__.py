"""The training side of weir: read packed builds as a torch ``IterableDataset``. Never imports Dagster."""

from loaders.dataset import IGNORE_INDEX, PackedDataset

__all__ = ["IGNORE_INDEX", "PackedDataset"]
