"""The text a ``bpe`` tokenizer is trained on: :func:`tokenizer_sample`, up to the mix's
``tokenizer.sample_bytes`` of its sources' records, read from the files each source's index lists.

Contract: an equal share of ``sample_bytes // len(mix.sources)`` characters per source, sources in sorted
order, each source's files in index order (the index's rows, less the paths it skipped), each record's text
cut where the share fills. Deterministic: the same files give the same sample, and a file past the point
where its source's share is full is never read, so changing it leaves the trained tokenizer as it was.
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from mixing.ingest.sources import read_records
from mixing.mixfile.mix import Mix
from mixing.output.layout import BuildLayout
from mixing.stage import StorageOptions

__all__ = ["tokenizer_sample"]


def _files(layout: BuildLayout, source: str) -> list[str]:
    index = pl.read_parquet(layout.source_dir(source) / "index.parquet")
    if "skipped" in index.columns:  # paths the index skipped (dangling symlinks, ...) are never read
        index = index.filter(pl.col("skipped").is_null())
    return index["path"].to_list()


def tokenizer_sample(mix: Mix, layout: BuildLayout, storage_options: StorageOptions = None) -> Iterator[str]:
    """Up to ``tokenizer.sample_bytes`` of text, an equal share per source, in index order.

    Deterministic: the same files (sorted) give the same sample, and a file past the point where its
    source's share is full is never read, so changing it leaves the trained tokenizer as it was.
    """
    share = mix.tokenizer.sample_bytes // len(mix.sources)
    for name in sorted(mix.sources):
        taken = 0
        for path in _files(layout, name):
            for rec in read_records(path, mix.sources[name], storage_options):
                if rec.text:
                    yield rec.text[: share - taken]
                    taken += min(len(rec.text), share - taken)
                if taken >= share:
                    break
            if taken >= share:
                break
