"""A continuation's base: what the build at ``continues.base`` trained before step N, and the checks that the
new mix leaves those steps alone.

``weir build NEW.yaml --continue BASE --at N`` (the mix file's ``continues``) makes a build whose steps
before N are BASE's, byte for byte, and whose steps from N on follow NEW.yaml. :class:`Base` reads of BASE
only what that needs, through its build root's storage (a folder or an fsspec root):

- its manifest, its shards' metadata (segments and steps; never a token), its plan's quotas
  (``plan/quotas.parquet``) and its sources' document tables;
- :meth:`Base.used`: per source, how often each document piece was trained before N (the continuation's draw
  skips a piece in the epochs BASE already used it in, and takes every other, so nothing is repeated or
  skipped across N; :mod:`mixing.plan.draws`);
- :meth:`Base.refusals`: every change of NEW.yaml that would alter steps before N (seed, sequence, tokenizer,
  cost, regroup, a phase's quota or length limit before N, a source's documents drawn before N), one line
  each, naming the field and N;
- :meth:`Base.prefix`: BASE's shard entries of steps before N, the last one cut (``stored``) when it also holds
  later steps; :meth:`Base.link_into` puts their files into the continuation's shards folder by hard link
  (local, same file system: no byte written) or by the store's own copy (another file system or an object
  store: the bytes are copied, never rewritten, and their checksums are the manifest's).

Reusing BASE's shard files whole (never a rewritten prefix) is what keeps the proof simple: the continuation's
manifest lists BASE's files with BASE's checksums, so every loader verifies the very bytes BASE trained on.
"""

from __future__ import annotations

import hashlib
import io
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from contract.atomic import atomic_path
from contract.digests import first_difference, read_step_digests
from contract.errors import WeirError
from contract.manifest import Manifest, ShardEntry
from contract.record import FeedbackNote, Lineage
from contract.shards import ShardSet
from contract.store import Store
from mixing.mixfile.mix import Mix
from mixing.output.commit import read_commit

__all__ = ["Base", "ContinuationError", "Used", "documents_digest"]


class ContinuationError(WeirError, ValueError):
    """The base cannot be read, or the new mix would change steps before the switch (names field and step)."""


@dataclass(frozen=True)
class Used:
    """One source's pieces trained before the switch: ``keys`` int64 [k] sorted (:meth:`key`) and ``counts``
    int64 [k], how many times each was (once per epoch it was drawn in)."""

    keys: np.ndarray
    counts: np.ndarray
    tokens: int  # tokens trained before the switch

    @staticmethod
    def key(doc_id: np.ndarray, start: np.ndarray, seq_len: int) -> np.ndarray:
        """The key of pieces (``doc_id``, ``start``) int64 [n]: ``doc_id · 2^24 + start // seq_len``."""
        return (np.asarray(doc_id, np.int64) << 24) + np.asarray(start, np.int64) // seq_len

    def times(self, doc_id: np.ndarray, start: np.ndarray, seq_len: int) -> np.ndarray:
        """int64 [n]: how many times each piece was trained before the switch (0 for most)."""
        k = self.key(doc_id, start, seq_len)
        at = np.clip(np.searchsorted(self.keys, k), 0, max(len(self.keys) - 1, 0))
        hit = (self.keys[at] == k) if len(self.keys) else np.zeros(len(k), bool)
        return np.where(hit, self.counts[at] if len(self.keys) else 0, 0)


def documents_digest(docs: pl.DataFrame) -> str:
    """sha256 of a source's documents as a plan sees them (doc_id, n_tokens, and where the tokens are: the chunk,
    a key of the files' content, the tokenizer and the reading fields, and the offset), by doc_id."""
    cols = docs.select("doc_id", "n_tokens", "chunk", "offset").sort("doc_id")
    h = hashlib.sha256()
    for c in ("doc_id", "n_tokens", "offset"):
        h.update(cols[c].cast(pl.Int64).to_numpy().astype("<i8").tobytes())
    h.update("\x00".join(cols["chunk"].cast(pl.String).fill_null("").to_list()).encode())
    return h.hexdigest()


class Base:
    """The build a continuation starts from, read through its root's storage (see the module's contract)."""

    def __init__(self, url: str, at: int, storage_options: dict[str, Any] | None = None) -> None:
        self.url, self.at, self._options = url, at, storage_options
        self.store = Store(url, storage_options)
        try:
            self.shards = ShardSet(f"{self.store.url}/shards", storage_options)
        except WeirError as e:
            raise ContinuationError(f"continues.base {url}: {e}") from None
        m = self.manifest
        if m.manifest_sha256 is None or m.steps is None or m.sources is None or m.global_batch is None:
            raise ContinuationError(f"continues.base {url}: built before continuations were possible; rebuild it")
        if not 1 <= at < m.steps + 1:
            raise ContinuationError(f"continues.at {at}: the base {url} has steps 0..{m.steps - 1}")
        steps = self.shards.steps
        self.seq_before = int(np.searchsorted(steps, at))  # sequences of steps < at: a prefix (steps ascend)

    @property
    def manifest(self) -> Manifest:
        return self.shards.manifest

    @property
    def build_id(self) -> str:
        """The base's identity as loaders know it: the sha256 of its ``manifest.json``'s bytes."""
        return hashlib.sha256(self.shards.manifest_bytes).hexdigest()

    def _parquet(self, name: str) -> pl.DataFrame:
        try:
            return pl.read_parquet(io.BytesIO(self.store.read(name)))
        except FileNotFoundError:
            raise ContinuationError(f"continues.base {self.url}: no {name}; is it a weir build root?") from None

    @cached_property
    def quotas(self) -> pl.DataFrame:
        """The base plan's quotas of the steps before the switch (step, phase, source, quota)."""
        return self._parquet("plan/quotas.parquet").filter(pl.col("step") < self.at)

    def documents(self, source: str) -> str:
        """:func:`documents_digest` of the base's ``source``."""
        return documents_digest(self._parquet(f"sources/{source}/docs.parquet"))

    def used(self, seq_len: int) -> dict[str, Used]:
        """Per source name of the base, its pieces trained before the switch (segments of its first
        :attr:`seq_before` sequences: metadata only)."""
        span = self.shards.span(0, self.seq_before)
        segs = span.segments
        names = self.manifest.sources or ()
        out = {}
        for i, name in enumerate(names):
            mine = segs[segs[:, 0] == i]
            keys, counts = np.unique(Used.key(mine[:, 1], mine[:, 2], seq_len), return_counts=True)
            out[name] = Used(keys, counts.astype(np.int64), int(mine[:, 3].sum()))
        return out

    def refusals(self, mix: Mix, quotas: pl.DataFrame, documents: dict[str, str]) -> list[str]:
        """Every change of ``mix`` that would alter the base's steps before the switch, one line each (empty:
        none). ``quotas``: the new mix's per-step quotas (:func:`mixing.plan.curriculum_plan.step_quotas`);
        ``documents``: :func:`documents_digest` of each of the new mix's sources."""
        m, n, out = self.manifest, self.at, []
        where = mix.path or "the mix"

        def differs(field: str, old: object, new: object) -> None:
            if old != new:
                out.append(
                    f"{where}: {field} is {new!r}, the base's was {old!r}; it would change the steps before step {n}"
                )

        differs("seed", m.seed, mix.seed)
        differs("sequence.length", m.seq_len, mix.sequence.length)
        differs("sequence.global_batch", m.global_batch, mix.sequence.global_batch)
        cost = mix.balance.cost.model()  # the packer's tie-break reads its compute terms; the hybrid deal's may change
        differs("balance.cost", (m.cost.attention, m.cost.linear), (cost.attention, cost.linear))
        regroup = mix.balance.regroup.model_dump() if mix.balance.regroup else None
        differs("balance.regroup", m.regroup.model_dump() if m.regroup else None, regroup)
        for ph in m.phases or ():
            if ph.first_step < n:
                new = [p for p in _phases(mix) if p[0] == ph.phase]
                if not new or new[0][1] != ph.first_step or (ph.first_step + ph.steps <= n and new[0][2] != ph.steps):
                    out.append(
                        f"{where}: curriculum phase {ph.phase!r} (steps {ph.first_step}..{ph.first_step + ph.steps - 1}"
                        f" in the base) is changed or missing; phases before step {n} must stay as they were"
                    )
        old_q = self.quotas.select("step", "source", "quota")
        new_q = quotas.filter(pl.col("step") < n).select("step", "source", "quota")
        joined = old_q.join(new_q, on=["step", "source"], how="full", coalesce=True).fill_null(0)
        bad = joined.filter(pl.col("quota") != pl.col("quota_right")).sort("step", "source")
        if bad.height:
            r = bad.row(0, named=True)
            phase = self.quotas.filter(pl.col("step") == r["step"])["phase"]
            out.append(
                f"{where}: the mixture of phase {phase[0] if len(phase) else '?'!r} at step {r['step']} gives "
                f"source {r['source']!r} {r['quota_right']} tokens, the base {r['quota']}; a weight before step {n} "
                "cannot change (start the new mixture at or after it, with a transition)"
            )
        drawn = set(self.quotas.filter(pl.col("quota") > 0)["source"].unique().to_list())
        for source in sorted(drawn):
            if source in documents and documents[source] != self.documents(source):
                out.append(
                    f"{where}: sources.{source}: its documents differ from the base's (files, tokenizer or reading "
                    f"fields changed), and steps before {n} drew from it"
                )
        return out

    def check(self, mix: Mix, quotas: pl.DataFrame, documents: dict[str, str], tokenizer_fingerprint: str) -> None:
        """Raise one :class:`ContinuationError` naming every refusal (:meth:`refusals`), the tokenizer's too."""
        problems = self.refusals(mix, quotas, documents)
        if tokenizer_fingerprint != self.manifest.tokenizer_fingerprint:
            problems.insert(
                0, f"{mix.path}: tokenizer differs from the base's; it would change the steps before step {self.at}"
            )
        if problems:
            head = f"cannot continue {self.url} at step {self.at}"
            raise ContinuationError(
                f"{head}: {problems[0]}"
                if len(problems) == 1
                else f"{head} ({len(problems)} problems):\n" + "\n".join(f"- {p}" for p in problems)
            )

    def prefix(self) -> list[ShardEntry]:
        """The base's shard entries of its first :attr:`seq_before` sequences; the last one cut to them (its
        ``stored`` the rows its files hold) when it also holds later steps."""
        out = []
        for s in self.manifest.shards:
            if s.first_sequence >= self.seq_before:
                break
            take = min(s.sequences, self.seq_before - s.first_sequence)
            out.append(s if take == s.sequences else s.model_copy(update={"sequences": take, "stored": s.rows}))
        return out

    def link_into(self, target: Store) -> int:
        """Put the files of :meth:`prefix` into ``target`` (the continuation's shards folder) under their own
        names; the bytes copied (0 where every file was hard-linked)."""
        copied = 0
        for entry in self.prefix():
            for f in entry.files.both():
                src = self.shards.store
                if src.local and target.local:
                    dst = target.path / f.name
                    dst.unlink(missing_ok=True)
                    try:
                        os.link(src.path / f.name, dst)
                        continue
                    except OSError:  # another file system, or links refused: copy
                        pass
                target.put(f.name, src.read(f.name))
                copied += f.bytes
        return copied

    def copy_tokenizer(self, into: Path) -> list[str]:
        """Copy the base's tokenizer files (those its commit record lists, checked against it) into ``into``;
        their names. A continuation tokenizes with its base's tokenizer, whatever its own sample would train."""
        record = read_commit(self.store, "tokenizer", None)
        if record is None:
            raise ContinuationError(f"continues.base {self.url}: its tokenizer stage is not committed; rebuild it")
        into.mkdir(parents=True, exist_ok=True)
        names = []
        for name, (size, sha) in sorted(record.files.items()):
            data = self.store.read(name)
            if len(data) != size or hashlib.sha256(data).hexdigest() != sha:
                raise ContinuationError(f"continues.base {self.url}/{name}: differs from its commit record; rebuild")
            with atomic_path(into / name.rsplit("/", 1)[-1]) as tmp:
                tmp.write_bytes(data)
            names.append(name.rsplit("/", 1)[-1])
        return names

    def prefix_problems(self, shards: ShardSet) -> list[str]:
        """What in the continuation ``shards`` differs from the base before the switch (empty: nothing): its
        first shard entries must be :meth:`prefix` (the same files, sizes and sha256) and its step digests
        before the switch the base's. (The files themselves are checked against those sha256 by every reader.)"""
        out, prefix = [], self.prefix()
        mine = list(shards.manifest.shards[: len(prefix)])
        if mine != prefix:
            out.append(f"its first {len(prefix)} shard entries are not the base's shards of steps before {self.at}")
        ours, theirs = read_step_digests(shards), read_step_digests(self.shards)
        if ours is None or theirs is None:
            out.append("a build records no step digests")
        elif (first := first_difference(ours[: self.at], theirs[: self.at])) is not None:
            out.append(f"step {first} differs from the base's (digest)")
        return out

    def lineage(self, feedback: FeedbackNote | None = None) -> tuple[Lineage, ...]:
        """The continuation's lineage: the base's, then this switch (with the ``feedback`` its weights came from)."""
        m = self.manifest
        own = Lineage(
            base=self.build_id,
            at=self.at,
            base_mix=m.mix_fingerprint,
            base_phases=m.phases or (),
            base_url=self.url,
            feedback=feedback,
        )
        return (*m.lineage, own)


def _phases(mix: Mix) -> list[tuple[str, int, int]]:
    """(name, first step, steps) of each phase of ``mix``."""
    out, at = [], 0
    for ph, n in zip(mix.curriculum, mix.phase_steps, strict=True):
        out.append((ph.phase, at, n))
        at += n
    return out
