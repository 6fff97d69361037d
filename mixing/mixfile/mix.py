"""The mix file: the one declarative description of a build.

A mix file is YAML, read with ``yaml.safe_load`` semantics only. ``load_mix`` validates it into a frozen
:class:`Mix`; every problem raises :class:`MixError` whose message names the file, the line and the field
path (``curriculum[1].mixture.math``) and says what was expected (for a misspelled field, the nearest valid
name). Loading never touches the disk beyond reading the file: :mod:`mixing.mixfile.paths` checks the paths
a mix names against the files.

One rule for every path a mix file names (a source's ``uri``, ``tokenizer.path``):
:func:`mixing.mixfile.pathrule.resolve_path`. A misspelled field's message names the nearest valid one
(:mod:`mixing.mixfile.suggest`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from contract.errors import WeirError
from mixing.mixfile import envvars
from mixing.mixfile.parts import (
    MAX_STEPS,
    NAME_PATTERN,
    Balance,
    Continues,
    Cost,
    FrozenModel,
    Phase,
    SequenceSpec,
    SourceSpec,
    TokenizerSpec,
    Transition,
)
from mixing.mixfile.pathrule import is_url, resolve_path
from mixing.mixfile.suggest import first_error, unknown_field

__all__ = [
    "Cost",
    "Mix",
    "MixError",
    "Phase",
    "SequenceSpec",
    "SourceSpec",
    "TokenizerSpec",
    "Transition",
    "load_mix",
    "parse_mix",
]


class MixError(WeirError, ValueError):
    """An invalid mix file. ``str(err)`` is one paragraph: ``FILE:LINE: FIELD: problem; expected ...``."""


class Mix(FrozenModel):
    """A validated mix file. ``path`` is where it was read from (absent for in-memory mixes).

    ``tokenizer.path`` holds the path as :func:`resolve_path` shows it (absolute and normalized,
    ``{env_NAME}`` kept), so the build's ``tokenizer/spec.json`` never holds a variable's value;
    :meth:`tokenizer_path` is the real path, as :meth:`source_uri` is a source's.
    """

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    seed: Annotated[int, Field(ge=0, lt=1 << 63)] = 0
    tokenizer: TokenizerSpec = TokenizerSpec()
    sequence: SequenceSpec
    sources: dict[str, SourceSpec]
    curriculum: Annotated[list[Phase], Field(min_length=1)]
    balance: Balance = Balance()
    normalize: bool = False
    continues: Continues | None = None
    path: str | None = Field(default=None, exclude=True)
    _steps: tuple[int, ...] = PrivateAttr(default=())
    _tokenizer_path: str | None = PrivateAttr(default=None)  # as written in the file
    _lines: dict[tuple[str | int, ...], int] = PrivateAttr(default_factory=dict)  # field path → line

    @field_validator("sources")
    @classmethod
    def _source_names(cls, v: dict[str, SourceSpec]) -> dict[str, SourceSpec]:
        if not v:
            raise ValueError("no sources; expected at least one")
        for name in v:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"source name {name!r} must match {NAME_PATTERN}")
        names: set[str] = set()
        for name, spec in v.items():
            names |= _path_variables((name, "uri"), spec.uri)  # under ``sources``, where this error is placed
        envvars.register(names)
        return v

    @model_validator(mode="after")
    def _resolve_tokenizer_path(self) -> Mix:
        written = self.tokenizer.path
        if written is not None:
            envvars.register(_path_variables(("tokenizer", "path"), written))
            try:
                shown = resolve_path(written, self.mix_dir)
            except ValueError as e:  # a NUL byte in a "~user" path
                raise _FieldError(("tokenizer", "path"), f"{e}; expected a file's path") from None
            object.__setattr__(self, "tokenizer", self.tokenizer.model_copy(update={"path": shown}))
            object.__setattr__(self, "_tokenizer_path", written)
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> Mix:
        seen: set[str] = set()
        for i, ph in enumerate(self.curriculum):
            if ph.phase in seen:
                raise _FieldError(("curriculum", i, "phase"), f"phase name {ph.phase!r} is used twice")
            seen.add(ph.phase)
            for src in ph.mixture:
                if src not in self.sources:
                    raise _FieldError(
                        ("curriculum", i, "mixture", src),
                        f"unknown source {src!r}; expected one of: {', '.join(sorted(self.sources))}",
                    )
            total = sum(ph.mixture.values())
            normalize = self.normalize if ph.normalize is None else ph.normalize
            if not normalize and not math.isclose(total, 1.0, abs_tol=1e-6):
                raise _FieldError(
                    ("curriculum", i, "mixture"),
                    f"mixture weights sum to {total:g}; expected them to sum to 1 (or set normalize: true "
                    "to divide them by their sum)",
                )
            if ph.transition is not None and i == 0 and ph.transition.shape != "step":
                raise _FieldError(
                    ("curriculum", 0, "transition"), "the first phase has no previous mixture to ramp from"
                )
        budget = self.balance.max_tokens
        if budget is not None and budget < self.sequence.length:
            raise _FieldError(
                ("balance", "max_tokens"),
                f"{budget} tokens is less than one sequence; expected at least sequence.length {self.sequence.length}",
            )
        object.__setattr__(self, "_steps", self._resolve_steps())
        if sum(self._steps) > MAX_STEPS:
            big = max(range(len(self._steps)), key=self._steps.__getitem__)
            field = "tokens" if self.curriculum[big].tokens is not None else "steps"
            raise _FieldError(
                ("curriculum", big, field),
                f"the run resolves to {sum(self._steps):,} steps ({self._steps[big]:,} in this phase); expected at "
                f"most {MAX_STEPS:,} steps",
            )
        if self.continues is not None:
            self._check_continues(self.continues)
        for i, (ph, n) in enumerate(zip(self.curriculum, self._steps, strict=True)):
            if ph.transition is not None and ph.transition.steps > n:
                raise _FieldError(
                    ("curriculum", i, "transition", "steps"),
                    f"the ramp is {ph.transition.steps} steps but the phase has only {n}",
                )
        return self

    def continuing(self, base: str, at: int) -> Mix:
        """This mix as a continuation of the build at ``base`` (a folder, relative to the current directory, or
        a URL) from step ``at``: what ``weir build MIX --continue BASE --at N`` builds. Raises :class:`MixError`."""
        if at < 1:
            raise MixError(f"--at {at}: expected a step ≥ 1 (step 0 has no past to keep)")
        c = Continues(base=base if is_url(base) else os.path.abspath(os.path.expanduser(base)), at=at)
        new = self.model_copy(update={"continues": c})
        try:
            new._check_continues(c)
        except _FieldError as e:
            raise MixError(f"--at {at} --continue {base}: {e.msg}") from None
        return new

    def _check_continues(self, c: Continues) -> None:
        """``continues.at`` inside the run; ``continues.base`` resolved by the path rule (no ``{env_NAME}``)."""
        if c.at >= sum(self._steps):
            raise _FieldError(
                ("continues", "at"), f"step {c.at} is not before the run's end ({sum(self._steps)} steps)"
            )
        if "{env_" in c.base:
            raise _FieldError(("continues", "base"), "a base build's path cannot name {env_...} variables")
        object.__setattr__(self, "continues", c.model_copy(update={"base": resolve_path(c.base, self.mix_dir)}))

    def _resolve_steps(self) -> tuple[int, ...]:
        """Steps per phase: ints as given, tokens rounded up to whole steps, percentages of the whole run.

        The whole run is ``fixed / (1 - Σ percent)`` steps where ``fixed`` is the other phases' steps, so
        an ``anneal`` of ``15%`` is 15% of all steps, itself included (rounded to the nearest step, ≥ 1).
        """
        per_step = self.sequence.length * self.sequence.global_batch
        fixed = 0
        for ph in self.curriculum:
            if isinstance(ph.steps, int):
                fixed += ph.steps
            elif ph.tokens is not None:
                fixed += -(-(ph.token_count() or 0) // per_step)
        pct = [ph.percent or 0.0 for ph in self.curriculum]
        if sum(pct) > 0:
            last = max(i for i, p in enumerate(pct) if p)
            if sum(pct) >= 100:
                raise _FieldError(
                    ("curriculum", last, "steps"),
                    f"the percentages of the phases sum to {sum(pct):g}%; expected less than 100%",
                )
            if fixed == 0:
                raise _FieldError(
                    ("curriculum", last, "steps"),
                    "every phase is a percentage; expected at least one phase in steps or tokens to fix the length",
                )
        run = fixed / (1 - sum(pct) / 100)
        # with regrouping, every phase is a whole number of template blocks: tokens round up, percentages
        # to the nearest block, and steps given as such must already be a multiple
        block = self.balance.regroup.period if self.balance.regroup else 1
        out = []
        for i, (ph, p) in enumerate(zip(self.curriculum, pct, strict=True)):
            if isinstance(ph.steps, int):
                if ph.steps % block:
                    lower, upper = ph.steps - ph.steps % block, ph.steps - ph.steps % block + block
                    raise _FieldError(
                        ("curriculum", i, "steps"),
                        f"{ph.steps} steps is not a multiple of balance.regroup.period {block}; expected "
                        f"{' or '.join(str(n) for n in (lower, upper) if n > 0)}",
                    )
                out.append(ph.steps)
            elif ph.tokens is not None:
                out.append(-(-(ph.token_count() or 0) // (per_step * block)) * block)
            else:
                out.append(max(1, round(run * p / 100 / block)) * block)
        return tuple(out)

    @property
    def phase_steps(self) -> tuple[int, ...]:
        """Resolved number of steps of each phase, in curriculum order."""
        return self._steps

    @property
    def total_steps(self) -> int:
        return sum(self._steps)

    @property
    def mix_dir(self) -> Path:
        return Path(self.path).resolve().parent if self.path else Path.cwd()

    def source_uri(self, name: str) -> str:
        """The source's glob by :func:`resolve_path`, ``{env_NAME}`` expanded: for fsspec only.

        Never show it: :meth:`shown_uri` is the same with the variables' values hidden (see
        :mod:`mixing.mixfile.envvars`). Raises :class:`MixError` when a variable the URI names is not set.
        """
        return self._real(("sources", name, "uri"), self.sources[name].uri)

    def shown_uri(self, name: str) -> str:
        """The source's glob as messages show it: :func:`resolve_path` with ``{env_NAME}`` kept."""
        return resolve_path(self.sources[name].uri, self.mix_dir)

    def tokenizer_path(self) -> str | None:
        """``tokenizer.path`` by :func:`resolve_path`, ``{env_NAME}`` expanded (the file to open; never show it).

        None when the mix names no tokenizer file. Raises :class:`MixError` when a variable it names is not set.
        """
        if self._tokenizer_path is None:
            return None
        return self._real(("tokenizer", "path"), self._tokenizer_path)

    def where(self, loc: tuple[str | int, ...]) -> str:
        """``FILE:LINE: field.path`` of ``loc``, the head of every message about a field of this mix file."""
        for n in range(len(loc), 0, -1):
            if loc[:n] in self._lines:
                return f"{self.path}:{self._lines[loc[:n]]}: {_dotted(loc)}"
        return f"{self.path}:1: {_dotted(loc)}"

    def _real(self, loc: tuple[str | int, ...], written: str) -> str:
        env = {}
        for var in sorted(_path_variables(loc, written)):
            if var not in os.environ:
                raise MixError(
                    f"{self.where(loc)}: environment variable {var} is not set; expected it set where weir runs "
                    f"(the path expands {{env_{var}}})"
                )
            env[var] = os.environ[var]
        return resolve_path(written, self.mix_dir, env)

    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of the validated mix (independent of formatting and comments)."""
        blob = json.dumps(self.model_dump(mode="json"), sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


def _path_variables(loc: tuple[str | int, ...], text: str) -> set[str]:
    """The ``{env_NAME}`` variables of a path; raise :class:`_FieldError` at ``loc`` for any other placeholder."""
    try:
        fields = [(f, conv, fmt) for _text, f, fmt, conv in string.Formatter().parse(text) if f is not None]
    except ValueError as e:
        raise _FieldError(loc, f"{e} (write {{{{ and }}}} for a literal brace)") from None
    out = set()
    for field, conv, fmt in fields:
        m = envvars.PLACEHOLDER.fullmatch(f"{{{field}}}")
        if (field not in ("mix_dir", "stdlib") and not m) or conv or fmt:
            shown = field + (f"!{conv}" if conv else "") + (f":{fmt}" if fmt else "")
            raise _FieldError(loc, f"unknown placeholder {{{shown}}}; expected {{mix_dir}}, {{stdlib}} or {{env_NAME}}")
        if m:
            if (why := envvars.refusal(m[1])) is not None:
                raise _FieldError(loc, why)
            out.add(m[1])
    return out


class _FieldError(ValueError):
    """A cross-field error that knows its field path (pydantic only knows the model's)."""

    def __init__(self, loc: tuple[str | int, ...], msg: str) -> None:
        super().__init__(msg)
        self.loc = loc
        self.msg = msg


def load_mix(path: str | os.PathLike[str]) -> Mix:
    """Read and validate the mix file at ``path``; raise :class:`MixError` naming file, line and field."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise MixError(f"{p}: cannot read the mix file: {e}") from None
    return parse_mix(text, str(p))


def parse_mix(text: str, filename: str = "<mix>") -> Mix:
    """Validate mix-file ``text``; ``filename`` is used in messages and to resolve ``{mix_dir}``.

    Every problem is a :class:`MixError` of one line; no input makes it raise anything else.
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        _no_duplicate_keys(node, (), filename)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else "?"
        problem = " ".join(str(e.problem or e).split())
        raise MixError(f"{filename}:{line}: YAML syntax error: {problem}; expected valid YAML") from None
    except MixError:
        raise
    except (yaml.YAMLError, RecursionError, ValueError) as e:  # e.g. nesting deeper than the parser's stack
        raise MixError(f"{filename}:1: unreadable YAML: {type(e).__name__}; expected a plain YAML mapping") from None
    if not isinstance(data, Mapping):
        raise MixError(f"{filename}:1: the mix file must be a mapping of fields (name, sequence, ...)")
    data = dict(data)
    data.pop("path", None)
    try:
        mix = Mix.model_validate({**data, "path": filename})
    except ValidationError as e:
        err = first_error(Mix, e.errors())
        loc, msg = tuple(err["loc"]), err["msg"]
        ctx = err.get("ctx") or {}
        if isinstance(ctx.get("error"), _FieldError):
            fe = ctx["error"]
            loc, msg = loc + fe.loc, fe.msg
        msg = msg.removeprefix("Value error, ")
        if err["type"] == "missing":
            msg = "field required but missing"
        elif err["type"] == "extra_forbidden":
            msg = unknown_field(Mix, loc)
        elif err["type"] == "string_type" and isinstance(err.get("input"), bool):
            msg = (
                f"YAML reads an unquoted yes, no, on, off, true or false as {err['input']}, not as a name; "
                "quote it (e.g. 'no')"
            )
        elif err["type"] == "finite_number":
            msg = f"{err.get('input')!r} is not a finite number; expected a number such as 0.25"
        more = f" ({len(e.errors()) - 1} more problem(s) after fixing this)" if len(e.errors()) > 1 else ""
        end = "" if msg.endswith("?") else "."
        line = " ".join(f"{_dotted(loc)}: {msg}{end}{more}".split())  # one line whatever a value holds
        raise MixError(f"{filename}:{_line_of(node, loc)}: {line}") from None
    except (ArithmeticError, RecursionError, TypeError, ValueError) as e:  # a safety net: never a traceback
        raise MixError(f"{filename}:1: cannot validate the mix file: {type(e).__name__}: {e}") from None
    object.__setattr__(mix, "_lines", _field_lines(node))
    return mix


def _field_lines(node: yaml.Node | None) -> dict[tuple[str | int, ...], int]:
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


def _no_duplicate_keys(node: yaml.Node | None, loc: tuple[Any, ...], filename: str) -> None:
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
                        f"{filename}:{k.start_mark.line + 1}: {_dotted((*loc, key))}: duplicate key {key!r} (first on "
                        f"line {first[key]}); expected each field once"
                    )
                if key is not None:
                    first[key] = k.start_mark.line + 1
                todo.append((v, (*loc, key)))
        elif isinstance(node, yaml.SequenceNode):
            todo += [(v, (*loc, i)) for i, v in enumerate(node.value)]


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not str(part).isprintable() or not str(part).strip() or " " in str(part):
            out += f"[{str(part)!r}]"  # a key of spaces or control characters stays visible and on one line
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int:
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
