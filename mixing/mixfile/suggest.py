"""The nearest valid name for a misspelled one: a field (``max_epoch`` → ``max_epochs``), from the models' own
fields, what the mix file's error says after "unknown field"; a source a mixture names (``qaa`` → ``qa``)."""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterable
from typing import Annotated, Any

from pydantic import BaseModel

__all__ = ["first_error", "known_fields", "nearest", "unknown_field"]


def first_error(root: type[BaseModel], errors: list[Any]) -> Any:
    """The error to report: the first, unless a field is missing because it was misspelled (``nmae: m``), then
    the unknown field whose nearest valid name is that missing field (its message says which)."""
    missing = {tuple(err["loc"]) for err in errors if err["type"] == "missing"}
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden" and loc:
            close = difflib.get_close_matches(str(loc[-1]), known_fields(root, loc[:-1]), n=1)
            if close and (*loc[:-1], close[0]) in missing:
                return err
    return errors[0]


def unknown_field(root: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The message for the unknown field at ``loc``: the nearest valid name there, else the valid names."""
    name = str(loc[-1])
    known = known_fields(root, loc[:-1])
    close = nearest(name, known)
    if close is not None:
        return f"unknown field {name!r}; did you mean {close!r}?"
    expected = f"one of: {', '.join(known)}" if known else "a field of the mix-file reference"
    return f"unknown field {name!r}; expected {expected} (see docs/mix-file.md)"


def nearest(name: str, names: Iterable[str]) -> str | None:
    """The one of ``names`` closest to a misspelled ``name`` (difflib's ratio ≥ 0.6), else None."""
    close = difflib.get_close_matches(name, list(names), n=1)
    return close[0] if close else None


def known_fields(root: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The fields the model at ``loc`` (a mapping of the mix file) declares, in their order; [] if unknown."""
    tp: Any = root
    for part in (*loc, None):
        args = [a for a in _members(tp) if a is not type(None)]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if part is None:
            return [f for f in models[0].model_fields if not models[0].model_fields[f].exclude] if models else []
        if models and isinstance(part, str) and part in models[0].model_fields:
            tp = models[0].model_fields[part].annotation
        elif containers := [a for a in args if typing.get_origin(a) in (dict, list, tuple)]:
            inner = typing.get_args(containers[0])
            tp = inner[-1] if typing.get_origin(containers[0]) is dict else inner[0]
        else:
            return []
    return []


def _members(tp: Any) -> list[Any]:
    """``tp`` without ``Annotated``, a union as its members."""
    if typing.get_origin(tp) is Annotated:
        return _members(typing.get_args(tp)[0])
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [m for a in typing.get_args(tp) for m in _members(a)]
    return [tp]
