"""Stage commit records: the point at which a stage's outputs in a build root become trustworthy.

An object store has no rename, so a stage cannot publish a folder atomically. Instead each run of a stage
(one per source for per-source stages) ends by writing ``commits/<stage>[/<partition>].json``, written last,
listing every file it published with its size and sha256, and sealed by a checksum of its own text. Before
a stage writes anything it removes its record (:func:`uncommit`), so a run killed at any moment leaves no
record of that stage, never one that lists a half-written file. A reader trusts only files a record lists,
and only as far as :func:`verify` finds them as listed.

Format: ``{"stage", "partition", "files": {name: {"bytes", "sha256"}}, "summary": {...}, "check"}``, as
``json.dumps(record, indent=1)`` writes it; ``check`` is the sha256 of the record's JSON (sorted keys) without
``check``. A record written into a fenced root (:func:`contract.fence.fenced`: a build holding an object-store
root's lease, :mod:`pipelines.lease`) also holds ``"generation"``, its writer's lease generation: the record is
written only once the fence admits it, and a reader can tell which holder of the root published it. A record
reads back only when its bytes are exactly what the writer wrote, so any change to them (in a value, or in
whitespace or an escape that JSON would read past) makes it unreadable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from contract.store import Store

__all__ = ["COMMITS", "Commit", "commit", "committed", "read_commit", "uncommit", "verify"]

COMMITS = "commits"  # the folder of commit records in a build root


@dataclass(frozen=True)
class Commit:
    """A verified-on-read commit record: ``files`` maps each published name to ``(bytes, sha256)``; ``generation``:
    the lease generation of the build that wrote it into a fenced root (None elsewhere)."""

    stage: str
    partition: str | None
    files: dict[str, tuple[int, str]]
    summary: dict[str, Any] = field(default_factory=dict)
    generation: int | None = None

    @property
    def name(self) -> str:
        return record_name(self.stage, self.partition)


def record_name(stage: str, partition: str | None) -> str:
    return f"{COMMITS}/{stage}.json" if partition is None else f"{COMMITS}/{stage}/{partition}.json"


def _check(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _text(record: dict[str, Any]) -> bytes:
    return json.dumps(record, indent=1).encode()


def commit(
    root: Store,
    stage: str,
    partition: str | None,
    files: list[dict[str, Any]],
    summary: dict[str, Any] | None = None,
) -> Commit:
    """Write the commit record of ``stage`` (``partition``) listing ``files`` (``{name, bytes, sha256}``, as
    :meth:`Store.put` returns them); call it after every listed file is written. In a fenced root the record
    carries the fence's generation, and is written only if the fence admits it (else its error is raised)."""
    listed = {f["name"]: {"bytes": int(f["bytes"]), "sha256": str(f["sha256"])} for f in files}
    fence = root.fence()
    generation = {} if fence is None else {"generation": int(fence.generation)}
    # as JSON reads it back (tuples as lists, keys as strings), so that the check and the Commit returned here are
    # the ones read_commit computes and returns
    body: dict[str, Any] = json.loads(
        json.dumps({"stage": stage, "partition": partition, "files": listed, "summary": summary or {}, **generation})
    )
    root.put(record_name(stage, partition), _text({**body, "check": _check(body)}))
    published = {n: (v["bytes"], v["sha256"]) for n, v in body["files"].items()}
    return Commit(stage, partition, published, body["summary"], body.get("generation"))


def uncommit(root: Store, stage: str, partition: str | None) -> None:
    """Remove the record of ``stage`` (``partition``): its outputs are about to change."""
    root.remove(record_name(stage, partition))


def read_commit(root: Store, stage: str, partition: str | None) -> Commit | None:
    """The record of ``stage`` (``partition``), or None when it is missing, is not byte for byte as written, or
    fails its own checksum. Other errors reading it (permissions, network) are raised, not taken for "missing"."""
    try:
        data = root.read(record_name(stage, partition))
    except (FileNotFoundError, IsADirectoryError):
        return None
    try:
        rec = json.loads(data)
        if _text(rec) != data:
            return None
        check = rec.pop("check")
        files = {str(n): (int(v["bytes"]), str(v["sha256"])) for n, v in rec["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):  # not JSON, or not shaped as a record
        return None
    if check != _check(rec) or rec.get("stage") != stage or rec.get("partition") != partition:
        return None
    generation = rec.get("generation")
    if generation is not None and type(generation) is not int:
        return None
    return Commit(stage, partition, files, dict(rec.get("summary") or {}), generation)


def committed(root: Store) -> list[Commit | str]:
    """Every record in ``root``: a :class:`Commit` for each that reads back whole, the record's name for each that
    does not (damaged, or written by something else). Hidden names (a writer's temporary files) are not records."""
    out: list[Commit | str] = []
    for entry in root.names(COMMITS):
        if entry.startswith("."):
            continue
        if entry.endswith(".json"):
            found = read_commit(root, entry.removesuffix(".json"), None)
            out.append(found or f"{COMMITS}/{entry}")
        else:
            for rec in root.names(f"{COMMITS}/{entry}"):
                if rec.startswith("."):
                    continue
                found = read_commit(root, entry, rec.removesuffix(".json"))
                out.append(found or f"{COMMITS}/{entry}/{rec}")
    return out


def verify(root: Store, c: Commit, *, deep: bool = True) -> list[str]:
    """What is wrong with the files ``c`` lists in ``root``, one line each in name order (missing, other size,
    and other sha256 when ``deep``; without ``deep`` no file is read); empty when all of them are as published."""
    problems = []
    for name, (size, sha) in sorted(c.files.items()):
        got: tuple[int, str] | None
        if deep:
            got = root.digest(name)
        else:
            n = root.size(name)
            got = None if n is None else (n, sha)
        if got is None:
            problems.append(f"{name}: missing")
        elif got != (size, sha):
            problems.append(f"{name}: {'size' if got[0] != size else 'sha256'} differs from the commit record")
    return problems
