"""Where in a mix file a problem is, and the one line that says so.

Contract: every problem with a mix file is a :class:`MixError` whose ``str`` is one line
``FILE:LINE: FIELD: problem; expected ...``. ``FIELD`` is a field path as :func:`dotted` writes it
(``curriculum[1].mixture.math``, ``(top level)`` for the empty path) and ``LINE`` is 1-based, read from the
YAML node tree (``yaml.compose``): :func:`line_of` finds one field's line while validating, and
:func:`field_lines` records every field's line for messages about a validated mix
(:meth:`~mixing.mixfile.mix.Mix.where`). :func:`no_duplicate_keys` refuses a key given twice in a mapping
(YAML would keep the last silently); :class:`FieldError` carries a cross-field problem's path out of a
pydantic validator; :func:`validation_error` turns pydantic's errors into the one :class:`MixError` to show.
Pure functions of their arguments: nothing here reads a file, and an alias is walked once.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from contract.errors import WeirError
from mixing.mixfile.suggest import first_error, unknown_field

__all__ = [
    "FieldError",
    "MixError",
    "dotted",
    "field_lines",
    "line_of",
    "no_duplicate_keys",
    "validation_error",
]


class MixError(WeirError, ValueError):
    """An invalid mix file. ``str(err)`` is one paragraph: ``FILE:LINE: FIELD: problem; expected ...``."""


class FieldError(ValueError):
    """A cross-field error that knows its field path (pydantic only knows the model's)."""

    def __init__(self, loc: tuple[str | int, ...], msg: str) -> None:
        super().__init__(msg)
        self.loc = loc
        self.msg = msg


def validation_error(root: type[BaseModel], e: ValidationError, node: yaml.Node | None, filename: str) -> MixError:
    """The :class:`MixError` for pydantic's errors ``e`` validating ``root`` from the YAML document ``node``.

    It names the first error (:func:`~mixing.mixfile.suggest.first_error`; a :class:`FieldError`'s own path
    appended to the model's) at its line in ``filename``, on one line whatever a value holds, and says how many
    more there are.
    """
    err = first_error(root, e.errors())
    loc, msg = tuple(err["loc"]), err["msg"]
    ctx = err.get("ctx") or {}
    if isinstance(ctx.get("error"), FieldError):
        fe = ctx["error"]
        loc, msg = loc + fe.loc, fe.msg
    msg = msg.removeprefix("Value error, ")
    if err["type"] == "missing":
        msg = "field required but missing"
    elif err["type"] == "extra_forbidden":
        msg = unknown_field(root, loc)
    elif err["type"] == "string_type" and isinstance(err.get("input"), bool):
        msg = (
            f"YAML reads an unquoted yes, no, on, off, true or false as {err['input']}, not as a name; "
            "quote it (e.g. 'no')"
        )
    elif err["type"] == "finite_number":
        msg = f"{err.get('input')!r} is not a finite number; expected a number such as 0.25"
    more = f" ({len(e.errors()) - 1} more problem(s) after fixing this)" if len(e.errors()) > 1 else ""
    end = "" if msg.endswith("?") else "."
    line = " ".join(f"{dotted(loc)}: {msg}{end}{more}".split())  # one line whatever a value holds
    return MixError(f"{filename}:{line_of(node, loc)}: {line}")


def field_lines(node: yaml.Node | None) -> dict[tuple[str | int, ...], int]:
    """The 1-based line of every field path of the YAML document (a mapping value's: its key's line)."""
    out: dict[tuple[str | int, ...], int] = {}
    todo: list[tuple[yaml.Node | None, tuple[str | int, ...]]] = [(node, ())]
    seen: set[int] = set()
    while todo:
        node, loc = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    out.setdefault((*loc, k.value), k.start_mark.line + 1)
                    todo.append((v, (*loc, k.value)))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                out[(*loc, i)] = v.start_mark.line + 1
                todo.append((v, (*loc, i)))
    return out


def no_duplicate_keys(node: yaml.Node | None, loc: tuple[Any, ...], filename: str) -> None:
    """Raise :class:`MixError` at the second occurrence of a key in any mapping (YAML would keep the last)."""
    seen: set[int] = set()
    todo: list[tuple[yaml.Node | None, tuple[Any, ...]]] = [(node, loc)]
    while todo:
        node, loc = todo.pop()
        if node is None or id(node) in seen:  # an alias repeats a node: check it once
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[str, int] = {}
            for k, v in node.value:
                key = k.value if isinstance(k, yaml.ScalarNode) else None
                if key is not None and key in first:
                    raise MixError(
                        f"{filename}:{k.start_mark.line + 1}: {dotted((*loc, key))}: duplicate key {key!r} (first on "
                        f"line {first[key]}); expected each field once"
                    )
                if key is not None:
                    first[key] = k.start_mark.line + 1
                todo.append((v, (*loc, key)))
        elif isinstance(node, yaml.SequenceNode):
            todo += [(v, (*loc, i)) for i, v in enumerate(node.value)]


def dotted(loc: tuple[Any, ...]) -> str:
    """``loc`` as a field path, ``curriculum[1].mixture.math``: a key that would not show on one line (spaces,
    control characters) is quoted in brackets, and the empty path is ``(top level)``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).isprintable() or not str(part).strip() or " " in str(part):
            out += f"[{str(part)!r}]"  # a key of spaces or control characters stays visible and on one line
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int:
    """1-based line of the deepest YAML node on ``loc`` (the parent's line when the field is missing)."""
    if node is None:
        return 1
    line = node.start_mark.line + 1
    for part in loc:
        child: yaml.Node | None = None
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if k.value == str(part):
                    child, line = v, k.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line
