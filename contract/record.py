"""What a build's manifest records of how the build was planned: the typed parts of ``BuildInfo``.

:class:`PhaseSpan` (a curriculum phase's steps), :class:`SourceCounts` (a source's tokens and documents, planned =
packed + dropped), :class:`Regroup` (the mix file's ``balance.regroup``, the loader's default; :data:`NO_REGROUP`
for a build without one), :class:`Lineage` (a switch in a continuation's history, with the :class:`FeedbackNote`
of weights taken from a loss log) and :class:`PackingNote` (how it was packed, in words). Each is a frozen,
strict value (:class:`contract.schema.Frozen`); a manifest is read and checked only through
:func:`contract.manifest.parse_manifest`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from contract.schema import Frozen, NonNeg, Pos, Weight

__all__ = ["NO_REGROUP", "FeedbackNote", "Lineage", "PackingNote", "PhaseSpan", "Regroup", "SourceCounts"]


class PhaseSpan(Frozen):
    """A curriculum phase of the build: ``steps`` optimizer steps from ``first_step`` on."""

    phase: str
    first_step: NonNeg
    steps: NonNeg


class SourceCounts(Frozen):
    """One source's tokens and documents in the build: planned = packed + dropped (at phase ends).
    ``documents_dropped`` is None in format 1 builds, which did not record it."""

    tokens_planned: NonNeg
    tokens_packed: NonNeg
    tokens_dropped: NonNeg
    documents_packed: NonNeg
    documents_dropped: NonNeg | None = None


class Regroup(Frozen):
    """The mix file's ``balance.regroup`` as the build recorded it: the loader's default ``window``,
    ``period`` and ``slack`` (:mod:`loaders.planner`). Its field defaults are the mix file's defaults too
    (:class:`mixing.mixfile.balance.Regroup` takes them from here)."""

    window: Pos = 20
    period: NonNeg = 10
    slack: Weight = 1.15  # a swap may raise a step's max/mean cost up to this (the DP goal's p95 at long context)


NO_REGROUP = Regroup(window=1, period=0)  # a build without regroup: training steps are the build's steps


class FeedbackNote(Frozen):
    """Mixture weights a continuation took from a loss log (:mod:`mixing.feedback`): the ``policy`` by name, the
    log's sha256, the steps ``[first, end)`` it averaged over, each source's loss per token there, the factor
    the policy gave each source, and the resulting ``weights`` of each phase from the switch on (phase →
    source → weight)."""

    policy: str
    losses_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    steps: tuple[NonNeg, NonNeg]
    loss: dict[str, float]
    factor: dict[str, float]
    weights: dict[str, dict[str, float]]


class Lineage(Frozen):
    """One switch in a build's history: steps before ``at`` are those of the build ``base`` (the sha256 of its
    ``manifest.json``'s bytes, the build_id loaders know it by), byte for byte; from ``at`` on the build follows its
    own mix. ``base_mix``: the base's ``mix_fingerprint``; ``base_phases``: the base's phases (a loader state saved
    on the base is judged against them, :mod:`loaders.switch`); ``base_url``: where the base was read from (for
    people); ``feedback``: the weights from N on taken from a loss log, with the policy's inputs (None: the mix
    file's own)."""

    base: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    at: Pos
    base_mix: str | None = None
    base_phases: tuple[PhaseSpan, ...] = ()
    base_url: str | None = None
    feedback: FeedbackNote | None = None


class PackingNote(Frozen):
    """How the shards were packed, in words (for people; no reader acts on it)."""

    algorithm: str
