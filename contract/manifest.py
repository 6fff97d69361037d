"""A shard folder's ``manifest.json``: the typed, versioned build contract, its checksum, and its one check.

:class:`Manifest` is the contract between the build and every reader: each field the build writes, typed,
with the defaults a manifest that lacks a field means (``pad_id`` 0, ``seed`` 0, ``micro_batches`` equal,
``cost`` attention only, no ``regroup``); nothing else reads ``manifest.json`` by key. Its
:class:`BuildInfo` part is what the writer of the shards is given (the mix, the tokenizer, the balance
options, the plan's phases and sources, ...; its typed parts are :mod:`contract.record`'s), the rest is the
shard format's own (``format_version``, ``seq_len``, ``dtype``, ``shards`` with each file's size and sha256, ...).
Every part follows :mod:`contract.schema` (strict, frozen, unknown keys ignored on read).

Since format 3 the manifest also carries ``manifest_sha256``, the sha256 of its own canonical JSON (keys
sorted, no whitespace) without that field, so an edit or a damaged byte anywhere in it is refused.
:func:`parse_manifest` is the only way a reader turns the manifest's bytes into a :class:`Manifest`:
unparsable JSON, a checksum mismatch, an unknown version, a missing field or a field of the wrong type each
raise one :class:`ShardError` line naming the file. Manifests written before format 3 (formats 1 and 2)
carry no checksum; they are still read, and ``parse_manifest`` says so (``ShardSet.sealed`` is False) for
callers to report. :func:`write_manifest` seals a manifest and writes it; the JSON holds exactly the fields
the writer gave (a field left out stays out), so a build's bytes do not depend on this module's defaults.
"""

from __future__ import annotations

import hashlib
import json
from functools import partial
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal, TypeVar

from pydantic import Field, ValidationError, model_validator

from contract.cost import CostModel
from contract.errors import WeirError, first_line
from contract.record import NO_REGROUP, Lineage, PackingNote, PhaseSpan, Regroup, SourceCounts
from contract.schema import Defaulted, Frozen, NonNeg, Pos
from contract.store import Store

__all__ = [
    "BUILD_FIELDS",
    "CHECKSUM_FIELD",
    "CONTINUATION_FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "READABLE",
    "BuildInfo",
    "Manifest",
    "ShardEntry",
    "ShardError",
    "ShardFile",
    "ShardFiles",
    "manifest_digest",
    "parse_manifest",
    "seal",
    "validated",
    "write_manifest",
]

MANIFEST = "manifest.json"
CHECKSUM_FIELD = "manifest_sha256"
FORMAT_VERSION = 3  # 3: the manifest carries its own sha256; 2: cost and token arrays per shard
CONTINUATION_FORMAT = 4  # 4: a continuation, whose last reused shard may hold more rows than it takes
READABLE = (1, 2, 3, 4)  # version 1 lacks the cost and token arrays; they are derived on read
_SEALED_SINCE = 3


class ShardError(WeirError, RuntimeError):
    """A missing, damaged or edited manifest or shard file, or a format this reader does not know."""


# -- the shard format's parts (the build's: contract.record) ----------------------------------------------


class ShardFile(Frozen):
    """A listed file (a shard's, or a build index's): a plain name inside its folder, its size in bytes and
    hex sha256."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
    bytes: NonNeg
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class ShardFiles(Frozen):
    """A shard's token array (``.npy``) and metadata arrays (``.npz``)."""

    tokens: ShardFile
    meta: ShardFile

    def both(self) -> tuple[ShardFile, ShardFile]:
        """``(tokens, meta)``."""
        return self.tokens, self.meta


class ShardEntry(Frozen):
    """Shard ``k`` holds the global sequences ``first_sequence`` … ``first_sequence + sequences − 1``.

    ``stored`` (format 4 only): the rows its files hold when that is more than ``sequences``: a continuation's
    last shard of its base, of which it takes the first ``sequences`` rows (the rest are the base's later steps).
    """

    first_sequence: NonNeg
    sequences: NonNeg
    files: ShardFiles
    stored: Pos | None = None

    @property
    def rows(self) -> int:
        """Rows of the shard's files: ``stored`` or ``sequences``."""
        return self.stored if self.stored is not None else self.sequences


BUILD_FIELDS = ("mix", "steps", "global_batch", "sources", "per_source", "phases")  # every weir build has them


class BuildInfo(Frozen):
    """What the writer of the shards records about the build (``weir build`` sets every field; other
    writers may leave any out, which then means its default).

    ``mix``: the mix's name; ``mix_fingerprint``/``tokenizer_fingerprint``: what the build was made from;
    ``vocab_size``: the embedding's rows; ``pad_id`` (default 0): the id in padding slots; ``eos_id``: the id
    ending each document (None: unrecorded); ``seed`` (default 0): the mix file's seed, the loader's default;
    ``global_batch``: sequences per optimizer step; ``cost``: the cost model (default attention only);
    ``micro_batches`` (default ``"equal"``), ``max_tokens`` and ``regroup`` (None: the build's steps):
    the mix file's ``balance`` options, the loader's defaults; ``steps``: optimizer steps of the run;
    ``sources``: the source names, in the order of the shards' source indices; ``phases``: the curriculum
    phases in step order; ``per_source``: tokens and documents per source; ``packing``: how it was packed;
    ``lineage``: the
    builds whose steps this one continues, oldest first (empty: none); ``step_digests``: the file of each
    step's digest (:mod:`contract.digests`; None: built before they were recorded).
    """

    mix: str | None = None
    mix_fingerprint: str | None = None
    tokenizer_fingerprint: str | None = None
    vocab_size: Pos | None = None
    pad_id: Annotated[NonNeg, Defaulted] = 0
    eos_id: NonNeg | None = None
    seed: Annotated[NonNeg, Defaulted] = 0
    global_batch: Pos | None = None
    cost: Annotated[CostModel, Defaulted] = CostModel()
    micro_batches: Annotated[Literal["equal", "unequal"], Defaulted] = "equal"
    max_tokens: Pos | None = None
    regroup: Regroup | None = None
    steps: NonNeg | None = None
    sources: tuple[str, ...] | None = None
    phases: tuple[PhaseSpan, ...] | None = None
    per_source: dict[str, SourceCounts] | None = None
    packing: PackingNote | None = None
    lineage: tuple[Lineage, ...] = ()
    step_digests: ShardFile | None = None

    @model_validator(mode="after")
    def _consistent_info(self) -> BuildInfo:
        for name in ("pad_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and self.vocab_size is not None and value >= self.vocab_size:
                raise ValueError(f"{name} {value} is not below vocab_size {self.vocab_size}")
        if self.sources is not None and self.per_source is not None and set(self.per_source) != set(self.sources):
            raise ValueError(f"per_source names {sorted(self.per_source)}, sources are {sorted(self.sources)}")
        return self

    @property
    def regrouping(self) -> Regroup:
        """The recorded ``regroup``, or :data:`NO_REGROUP` (window 1, period 0) when the build has none."""
        return self.regroup if self.regroup is not None else NO_REGROUP

    def lacks(self) -> list[str]:
        """The fields of :data:`BUILD_FIELDS` this manifest lacks (none for a ``weir build``)."""
        return [name for name in BUILD_FIELDS if getattr(self, name) is None]

    def as_json(self) -> dict[str, Any]:
        """The JSON object of the fields that were given (a field left out stays out)."""
        return self.model_dump(mode="json", exclude_unset=True)


class Manifest(BuildInfo):
    """A build's ``manifest.json``: :class:`BuildInfo` plus the shard format's fields.

    ``format_version`` (1–4, :data:`READABLE`); ``seq_len`` S: token slots per sequence; ``sequences``: in
    the whole build; ``sequences_per_step``: when every step has as many (else None); ``dtype``: of the
    token arrays; ``shards``: in sequence order; ``manifest_sha256``: the checksum (None before format 3).
    """

    format_version: Literal[1, 2, 3, 4]
    seq_len: NonNeg
    sequences: NonNeg
    sequences_per_step: Pos | None = None
    dtype: Literal["uint16", "uint32"]
    shards: tuple[ShardEntry, ...]
    manifest_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None

    @model_validator(mode="after")
    def _consistent_shards(self) -> Manifest:
        at = 0
        for k, s in enumerate(self.shards):
            if s.first_sequence != at:
                raise ValueError(f"shards[{k}].first_sequence is {s.first_sequence}, expected {at}")
            at += s.sequences
            if s.stored is not None and (self.format_version < CONTINUATION_FORMAT or s.stored <= s.sequences):
                raise ValueError(f"shards[{k}].stored is {s.stored}: only a format 4 shard holds rows past its own")
        if at != self.sequences:
            raise ValueError(f"sequences is {self.sequences} but the shards hold {at}")
        per_step = self.sequences_per_step
        if per_step is not None and self.global_batch is not None and per_step != self.global_batch:
            raise ValueError(f"global_batch {self.global_batch} but the shards hold {per_step} sequences per step")
        return self

    def info(self) -> BuildInfo:
        """The :class:`BuildInfo` part, as given (e.g. to write the same build's sequences again)."""
        fields = set(BuildInfo.model_fields) & self.model_fields_set
        return BuildInfo.model_validate_json(json.dumps(self.model_dump(mode="json", include=fields)))

    def as_json(self) -> dict[str, Any]:
        """The JSON object of the fields that were given, without ``manifest_sha256`` (what it is a digest of)."""
        return self.model_dump(mode="json", exclude_unset=True, exclude={CHECKSUM_FIELD})


# -- checksum, writing and reading -------------------------------------------------------------------------


def manifest_digest(manifest: dict[str, Any]) -> str:
    """Hex sha256 of ``manifest``'s canonical JSON (sorted keys, no whitespace), without ``manifest_sha256``."""
    body = {k: v for k, v in manifest.items() if k != CHECKSUM_FIELD}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """The JSON object ``manifest`` with ``manifest_sha256`` set to the digest of the rest (any old value is
    replaced). Not validated: :func:`write_manifest` is the way to write one."""
    return {**manifest, CHECKSUM_FIELD: manifest_digest(manifest)}


_M = TypeVar("_M", bound=BuildInfo)


def validated(cls: type[_M], fields: BuildInfo | dict[str, Any], where: str) -> _M:
    """``fields`` as a ``cls`` (:class:`BuildInfo` or :class:`Manifest`), validated as a reader would;
    a dict may hold only declared fields. Raises one :class:`ShardError` line starting with ``where``."""
    if isinstance(fields, cls):
        return fields
    given = fields.as_json() if isinstance(fields, BuildInfo) else fields
    unknown = sorted(set(given) - set(cls.model_fields))
    if unknown:
        raise ShardError(f"{where}: {unknown[0]}: not a field of the manifest")
    return _validate(cls, json.dumps(given), where)


def _validate(cls: type[_M], text: str | bytes, where: str) -> _M:
    try:
        return cls.model_validate_json(text)
    except ValidationError as e:
        err = e.errors()[0]
        loc = _dotted(tuple(err["loc"]))
        msg = "field required but missing" if err["type"] == "missing" else err["msg"].removeprefix("Value error, ")
        raise ShardError(f"{where}: {loc}{': ' if loc else ''}{msg}") from None


def write_manifest(
    shards_dir: Path | str, manifest: Manifest | dict[str, Any], storage_options: dict[str, Any] | None = None
) -> Manifest:
    """Seal ``manifest`` (a dict is validated into a :class:`Manifest` first) and write it as
    ``shards_dir/manifest.json`` atomically; return what was written.

    Also the way to change a manifest on purpose (tests, migrations): read it, edit it, write it here.
    """
    typed = validated(Manifest, manifest, f"{shards_dir}/{MANIFEST}")
    sealed = seal(typed.as_json())
    text = json.dumps(sealed, indent=2, sort_keys=True) + "\n"
    Store(shards_dir, storage_options).put(MANIFEST, partial(_write, text.encode()))
    return typed.model_copy(update={CHECKSUM_FIELD: sealed[CHECKSUM_FIELD]})


def _write(data: bytes, f: BinaryIO) -> None:
    f.write(data)


def parse_manifest(data: bytes, where: str) -> tuple[Manifest, bool]:
    """The manifest in ``data`` (read from ``where``, named in errors) and whether it carried a checksum.

    Raises :class:`ShardError` (one line starting with ``where``) when it is not JSON, not an object, its
    ``manifest_sha256`` does not match, its version is unknown, a version-3 manifest lacks the checksum,
    or a field is missing, of the wrong type or inconsistent with the others.
    """
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise ShardError(f"{where}: not valid JSON ({first_line(e)}); the file is damaged, rebuild") from None
    if not isinstance(manifest, dict):
        raise ShardError(f"{where}: not a JSON object but {type(manifest).__name__}; the file is damaged, rebuild")
    stored = manifest.get(CHECKSUM_FIELD)
    if stored is not None and stored != manifest_digest(manifest):
        raise ShardError(
            f"{where}: content does not match its {CHECKSUM_FIELD}; the manifest was edited or damaged "
            "after the build wrote it (rebuild, or write changes with contract.manifest.write_manifest)"
        )
    version = manifest.get("format_version")
    if type(version) is not int or version not in READABLE:
        raise ShardError(f"{where}: format_version {version!r}; this reader knows {list(READABLE)}")
    if stored is None and version >= _SEALED_SINCE:
        raise ShardError(f"{where}: no {CHECKSUM_FIELD}, which every format {version} manifest carries; rebuild")
    return _validate(Manifest, data, where), stored is not None


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out
