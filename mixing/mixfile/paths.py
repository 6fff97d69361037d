"""The paths a mix file names, checked against the files: what ``weir validate`` adds to the schema.

Contract: :func:`check_paths` takes a validated :class:`~mixing.mixfile.mix.Mix` and returns a
:class:`PathCheck` of ``problems`` (each one line ``FILE:LINE: field.path: problem; expected ...``, the
format of :class:`~mixing.mixfile.locations.MixError`) and ``notes`` (one line each: what it did not check). It
never raises for a wrong path, never reads a file's contents nor tokenizes, and never shows an
``{env_NAME}`` value. It checks, for each source's ``uri`` and ``tokenizer.path`` as
:func:`~mixing.mixfile.mix.resolve_path` resolves them:

- every ``{env_NAME}`` the path names is set, and no ``{mix_dir}``, ``{stdlib}`` or ``{env_NAME}`` is left
  once it is expanded (an escaped ``{{mix_dir}}``, a variable whose value holds one);
- ``tokenizer.path`` of an ``hf`` tokenizer is a readable local file (another kind does not read it: a note);
- with ``list_sources``, the ``uri`` matches at least one file to read, listed as the build lists it
  (:func:`mixing.ingest.sources.index_source`, the one owner of what a URI matches): a local one always, one
  in object storage only with ``storage_options`` (an endpoint or credentials, from the ``AWS_*``
  variables), else a note says it was not checked.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from mixing.mixfile import envvars
from mixing.mixfile.locations import MixError
from mixing.mixfile.mix import Mix
from mixing.mixfile.pathrule import is_url

__all__ = ["PathCheck", "check_paths"]

_LEFT = re.compile(r"\{(?:mix_dir|stdlib|env_[A-Za-z_][A-Za-z0-9_]*)\}")
_S3_QUICK = {"connect_timeout": 5, "read_timeout": 20, "retries": {"max_attempts": 2}}  # fail in seconds


class PathCheck(NamedTuple):
    """What :func:`check_paths` found: ``problems`` (the mix cannot build as it is) and ``notes``."""

    problems: list[str]
    notes: list[str]


def check_paths(mix: Mix, storage_options: Mapping[str, Any] | None = None, *, list_sources: bool = True) -> PathCheck:
    """Check the paths ``mix`` names against the files (see the module's docstring); ``storage_options`` are
    fsspec's for a source in object storage. Without ``list_sources`` no source is listed (seconds saved when
    the caller lists them next anyway)."""
    problems: list[str] = []
    notes: list[str] = []
    tok = mix.tokenizer
    if tok.path is not None and tok.kind != "hf":
        notes.append(f"{mix.where(('tokenizer', 'path'))}: not used by kind {tok.kind!r} (only kind 'hf' reads a file)")
    elif tok.path is not None:
        path = _expanded(mix, ("tokenizer", "path"), problems, mix.tokenizer_path)
        if path is not None and (why := _unreadable(path)) is not None:
            problems.append(f"{mix.where(('tokenizer', 'path'))}: {envvars.redact(why)}")
    for name in mix.sources:
        loc = ("sources", name, "uri")
        uri = _expanded(mix, loc, problems, functools.partial(mix.source_uri, name))
        if uri is None or not list_sources:
            continue
        remote = is_url(uri) and not uri.startswith("file://")
        if remote and not storage_options:
            notes.append(
                f"{mix.where(loc)}: not checked: {envvars.redact(uri)!r} is in object storage and no S3 endpoint or "
                "credentials are set (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); weir build lists it"
            )
        elif (why := _no_files(mix, name, uri, storage_options)) is not None:
            problems.append(f"{mix.where(loc)}: {envvars.redact(why)}")
    return PathCheck(problems, notes)


def _expanded(mix: Mix, loc: tuple[str, ...], problems: list[str], real: Callable[[], str | None]) -> str | None:
    """``real()`` (the real path), or None after adding why it cannot be used (a variable unset, a placeholder left)."""
    try:
        path = real()
    except MixError as e:  # a variable not set: the message names file, line and field
        problems.append(str(e))
        return None
    except ValueError as e:  # a NUL byte in a "~user" path
        problems.append(f"{mix.where(loc)}: {e}; expected a path")
        return None
    if path is None:
        return None
    if (left := _LEFT.search(path)) is not None:
        problems.append(
            f"{mix.where(loc)}: expanding it leaves the placeholder {left[0]} in {envvars.redact(path)!r}; expected "
            "placeholders in single braces ({{ and }} are a literal brace) and variables whose values hold none"
        )
        return None
    return path


def _unreadable(path: str) -> str | None:
    """Why the tokenizer file ``path`` cannot be read, or None."""
    if is_url(path):
        return f"{path!r} is a URL; expected a local tokenizer.json file"
    if not os.path.exists(path):
        return f"no such file {path!r}; expected a tokenizer.json (a relative path starts at the mix file's folder)"
    if not os.path.isfile(path):
        return f"{path!r} is not a file; expected a tokenizer.json"
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:
        return f"cannot read {path!r}: {e.strerror or e}; expected a readable tokenizer.json"
    return None


def _no_files(mix: Mix, name: str, uri: str, storage_options: Mapping[str, Any] | None) -> str | None:
    """Why source ``name`` (real URI ``uri``) has no file to read, as the build's index says, or None."""
    from mixing.ingest.sources import SourceIndexError, index_source  # the build's own listing (polars, fsspec)

    options = dict(storage_options or {})
    if uri.startswith("s3://"):
        options.setdefault("config_kwargs", _S3_QUICK)
    try:
        index_source(mix, name, options or None)
    except SourceIndexError as e:
        return str(e).removeprefix(f"source {name!r}: ")
    except Exception as e:  # a storage client's own error: a problem to show, never a traceback
        return f"cannot list {uri!r}: {type(e).__name__}: {e}"
    return None
