"""The build contract: everything a reader of a build needs, and nothing of how the build was made.

The factory (:mod:`mixing`) writes a build through it and the reader (:mod:`loaders`) reads a build through it;
it imports neither. Its dependencies are what a training node installs anyway: numpy, fsspec and pydantic.

    manifest    the typed ``manifest.json`` (``Manifest``, ``BuildInfo``), parsed and checked: one ``ShardError``
    record      what a manifest records of how the build was planned (phases, counts, regroup, lineage)
    schema      the rules every typed part of the manifest follows (strict, frozen, unknown keys ignored)
    shards      ``ShardSet``: a build's shard folder, local or fsspec, its sequences as ``SequenceView``
    index       the per-sequence metadata arrays a reader maps (``map_index``, ``write_index``)
    cost        ``CostModel``: the predicted cost of a document of l tokens, shared by packer and balancer
    store       ``Store``: a build root's storage, local or fsspec, whole-file checksummed writes
    ranges      ranged reads of one object coalesced into few requests
    fence       writes under a leased root checked against the lease
    redaction   secrets kept out of every URL a message shows
    atomic      ``atomic_path``: a local file written so that a reader never sees a part of it
    errors      ``WeirError``, the base of every error reported as one line, and ``first_line``
"""

from contract.cost import CostModel
from contract.errors import WeirError
from contract.manifest import Manifest, ShardError
from contract.shards import ShardSet
from contract.store import Store, StoreError

__all__ = ["CostModel", "Manifest", "ShardError", "ShardSet", "Store", "StoreError", "WeirError"]
