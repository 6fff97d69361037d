"""A shard folder's ``manifest.json``: its fields, its own checksum, and the one check every reader gets.

The manifest lists every shard file with its size and sha256; since format 3 it also carries
``manifest_sha256``, the sha256 of its own canonical JSON (keys sorted, no whitespace) without that field,
so an edit or a damaged byte anywhere in it is refused. :func:`parse_manifest` is the only way a reader
turns the manifest's bytes into a dict: unparsable JSON, a checksum mismatch, an unknown version, a missing
field or a field of the wrong type each raise one :class:`ShardError` line naming the file. Manifests
written before format 3 (formats 1 and 2) carry no checksum; they are still read, and
``parse_manifest`` says so (``ShardSet.sealed`` is False) for callers to report.
"""

from __future__ import annotations

import hashlib
import json
from functools import partial
from pathlib import Path
from typing import Annotated, Any, BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mixing.errors import WeirError
from mixing.format.store import Store

__all__ = [
    "CHECKSUM_FIELD",
    "FORMAT_VERSION",
    "MANIFEST",
    "READABLE",
    "ShardError",
    "manifest_digest",
    "parse_manifest",
    "seal",
    "write_manifest",
]

MANIFEST = "manifest.json"
CHECKSUM_FIELD = "manifest_sha256"
FORMAT_VERSION = 3  # 3: the manifest carries its own sha256; 2: cost and token arrays per shard
READABLE = (1, 2, 3)  # version 1 lacks the cost and token arrays; they are derived on read
_SEALED_SINCE = 3


class ShardError(WeirError, RuntimeError):
    """A missing, damaged or edited manifest or shard file, or a format this reader does not know."""


def manifest_digest(manifest: dict[str, Any]) -> str:
    """Hex sha256 of ``manifest``'s canonical JSON (sorted keys, no whitespace), without ``manifest_sha256``."""
    body = {k: v for k, v in manifest.items() if k != CHECKSUM_FIELD}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with ``manifest_sha256`` set to the digest of the rest (any old value is replaced)."""
    return {**manifest, CHECKSUM_FIELD: manifest_digest(manifest)}


def write_manifest(
    shards_dir: Path | str, manifest: dict[str, Any], storage_options: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Seal ``manifest`` and write it as ``shards_dir/manifest.json`` atomically; return what was written.

    Also the way to change a manifest on purpose (tests, migrations): read it, edit it, write it here.
    """
    sealed = seal(manifest)
    text = json.dumps(sealed, indent=2, sort_keys=True) + "\n"
    Store(shards_dir, storage_options).put(MANIFEST, partial(_write, text.encode()))
    return sealed


def _write(data: bytes, f: BinaryIO) -> None:
    f.write(data)


# -- the fields a reader relies on; the build's other fields (fingerprints, per_source, ...) pass through --

_NonNeg = Annotated[int, Field(ge=0)]
_Pos = Annotated[int, Field(ge=1)]
_Cfg = ConfigDict(strict=True, extra="ignore")


class _File(BaseModel):
    model_config = _Cfg
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]  # a plain name in the folder
    bytes: _NonNeg
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class _Files(BaseModel):
    model_config = _Cfg
    tokens: _File
    meta: _File


class _Shard(BaseModel):
    model_config = _Cfg
    first_sequence: _NonNeg
    sequences: _NonNeg
    files: _Files


class _Cost(BaseModel):
    model_config = _Cfg
    attention: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0
    linear: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0


class _Regroup(BaseModel):
    model_config = _Cfg
    window: _Pos = 20
    period: _NonNeg = 10
    slack: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.15


class _Phase(BaseModel):
    model_config = _Cfg
    phase: str
    first_step: _NonNeg
    steps: _NonNeg


class _Manifest(BaseModel):
    model_config = _Cfg
    format_version: int
    seq_len: _NonNeg
    sequences: _NonNeg
    sequences_per_step: _Pos | None = None
    dtype: Literal["uint16", "uint32"]
    shards: list[_Shard]
    # written by weir build (write_packed); optional for other writers of shards
    mix: str | None = None
    global_batch: _Pos | None = None
    pad_id: _NonNeg | None = None
    eos_id: _NonNeg | None = None
    seed: _NonNeg | None = None  # the mix file's seed (the loader's default seed)
    vocab_size: _Pos | None = None
    cost: _Cost | None = None
    steps: _NonNeg | None = None
    sources: list[str] | None = None
    per_source: dict[str, dict[str, _NonNeg]] | None = None
    phases: list[_Phase] | None = None
    micro_batches: Literal["equal", "unequal"] | None = None
    max_tokens: _Pos | None = None
    regroup: _Regroup | None = None

    @model_validator(mode="after")
    def _consistent(self) -> _Manifest:
        at = 0
        for k, s in enumerate(self.shards):
            if s.first_sequence != at:
                raise ValueError(f"shards[{k}].first_sequence is {s.first_sequence}, expected {at}")
            at += s.sequences
        if at != self.sequences:
            raise ValueError(f"sequences is {self.sequences} but the shards hold {at}")
        for name in ("pad_id", "eos_id"):
            value = getattr(self, name)
            if value is not None and self.vocab_size is not None and value >= self.vocab_size:
                raise ValueError(f"{name} {value} is not below vocab_size {self.vocab_size}")
        per_step = self.sequences_per_step
        if per_step is not None and self.global_batch is not None and per_step != self.global_batch:
            raise ValueError(f"global_batch {self.global_batch} but the shards hold {per_step} sequences per step")
        if self.sources is not None and self.per_source is not None and set(self.per_source) != set(self.sources):
            raise ValueError(f"per_source names {sorted(self.per_source)}, sources are {sorted(self.sources)}")
        return self


def parse_manifest(data: bytes, where: str) -> tuple[dict[str, Any], bool]:
    """The manifest in ``data`` (read from ``where``, named in errors) and whether it carried a checksum.

    Raises :class:`ShardError` (one line starting with ``where``) when it is not JSON, not an object, its
    ``manifest_sha256`` does not match, its version is unknown, a version-3 manifest lacks the checksum,
    or a field is missing, of the wrong type or inconsistent with the others.
    """
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, UnicodeDecodeError
        raise ShardError(f"{where}: not valid JSON ({_first_line(e)}); the file is damaged, rebuild") from None
    if not isinstance(manifest, dict):
        raise ShardError(f"{where}: not a JSON object but {type(manifest).__name__}; the file is damaged, rebuild")
    stored = manifest.get(CHECKSUM_FIELD)
    if stored is not None and stored != manifest_digest(manifest):
        raise ShardError(
            f"{where}: content does not match its {CHECKSUM_FIELD}; the manifest was edited or damaged "
            "after the build wrote it (rebuild, or write changes with mixing.format.manifest.write_manifest)"
        )
    version = manifest.get("format_version")
    if type(version) is not int or version not in READABLE:
        raise ShardError(f"{where}: format_version {version!r}; this reader knows {list(READABLE)}")
    if stored is None and version >= _SEALED_SINCE:
        raise ShardError(f"{where}: no {CHECKSUM_FIELD}, which every format {version} manifest carries; rebuild")
    try:
        _Manifest.model_validate(manifest)
    except ValidationError as e:
        err = e.errors()[0]
        loc = _dotted(tuple(err["loc"]))
        msg = "field required but missing" if err["type"] == "missing" else err["msg"].removeprefix("Value error, ")
        raise ShardError(f"{where}: {loc}{': ' if loc else ''}{msg}") from None
    return manifest, stored is not None


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
