"""``weir diff A B``: where two builds' training steps part, from their step digests (:mod:`contract.digests`).

Each build is opened as its shards (a folder, its ``shards/``, or an fsspec URL); its recorded digests are
read checked against its manifest, or recomputed from the shards for a build that recorded none (it says
so). When B continues A (B's lineage names A's ``build_id``) the result says at which step it switched.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contract.digests import compute_step_digests, first_difference, read_step_digests
from contract.shards import ShardSet
from contract.store import is_local

__all__ = ["BuildDiff", "diff_builds", "open_shards"]


@dataclass(frozen=True)
class BuildDiff:
    """``a`` and ``b``: the builds' ids (the sha256 of their ``manifest.json``, as loaders name them);
    ``steps_a``/``steps_b``: their steps;
    ``identical``: the leading steps whose digests are equal; ``first_difference``: the first step that
    differs (None: none, the builds hand out the same steps); ``continues_at``: the switch step when ``b``
    continues ``a`` (None otherwise); ``recomputed``: the builds whose digests were recomputed from shards."""

    a: str
    b: str
    steps_a: int
    steps_b: int
    identical: int
    first_difference: int | None
    continues_at: int | None
    recomputed: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return {
            "a": self.a,
            "b": self.b,
            "steps_a": self.steps_a,
            "steps_b": self.steps_b,
            "identical_steps": self.identical,
            "first_difference": self.first_difference,
            "continues_at": self.continues_at,
            "recomputed": list(self.recomputed),
        }

    def lines(self) -> list[str]:
        """What ``weir diff`` prints."""
        n = self.identical
        out = [f"steps 0..{n - 1} identical ({n} digests)" if n else "step 0 differs"]
        if self.first_difference is None:
            out[0] = f"identical: all {n} steps ({n} digests)"
        elif n < min(self.steps_a, self.steps_b):
            out.append(f"first difference at step {self.first_difference}")
        else:
            out.append(f"one build ends at step {n}: A has {self.steps_a} steps, B {self.steps_b}")
        if self.continues_at is not None:
            out.append(f"B continues A at step {self.continues_at}")
        out += [f"note: {r} recorded no step digests; recomputed from its shards" for r in self.recomputed]
        return out


def open_shards(where: str, storage_options: dict[str, Any] | None = None) -> ShardSet:
    """The shards of a build given as its folder, its ``shards/`` folder or a URL of either."""
    if is_local(where):
        p = Path(where.removeprefix("file://"))
        return ShardSet(p if p.name == "shards" or not (p / "shards").is_dir() else p / "shards")
    url = where.rstrip("/")
    return ShardSet(url if url.endswith("/shards") else f"{url}/shards", storage_options)


def _digests(shards: ShardSet, name: str, recomputed: list[str]) -> np.ndarray:
    got = read_step_digests(shards)
    if got is None:
        recomputed.append(name)
        got = compute_step_digests(shards)
    return got


def diff_builds(a: ShardSet, b: ShardSet) -> BuildDiff:
    """Compare the steps of builds ``a`` and ``b`` (raises :class:`~contract.manifest.ShardError` for a
    damaged one)."""
    recomputed: list[str] = []
    da, db = _digests(a, "A", recomputed), _digests(b, "B", recomputed)
    first = first_difference(da, db)
    ida, idb = (hashlib.sha256(x.manifest_bytes).hexdigest() for x in (a, b))
    switch = [x.at for x in b.manifest.lineage if x.base == ida]
    return BuildDiff(
        a=ida,
        b=idb,
        steps_a=len(da),
        steps_b=len(db),
        identical=first if first is not None else len(da),
        first_difference=first,
        continues_at=switch[-1] if switch else None,
        recomputed=tuple(recomputed),
    )
