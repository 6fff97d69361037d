"""The mix file: the one declarative description of a build.

A mix file is YAML, read with ``yaml.safe_load`` semantics only. ``load_mix`` validates it into a frozen
:class:`Mix`; every problem raises :class:`~mixing.mixfile.locations.MixError` whose message names the file,
the line and the field path (``curriculum[1].mixture.math``: :mod:`mixing.mixfile.locations`) and says what
was expected (for a misspelled field, the nearest valid name). Loading never touches the disk beyond reading
the file: :mod:`mixing.mixfile.paths` checks the paths a mix names against the files.

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
from typing import Annotated

import yaml
from pydantic import (
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from mixing.mixfile import envvars
from mixing.mixfile.balance import Balance, Cost
from mixing.mixfile.locations import (
    FieldError,
    MixError,
    dotted,
    field_lines,
    no_duplicate_keys,
    validation_error,
)
from mixing.mixfile.parts import (
    MAX_STEPS,
    NAME_PATTERN,
    Continues,
    FrozenModel,
    SequenceSpec,
    SourceSpec,
    TokenizerSpec,
)
from mixing.mixfile.pathrule import is_url, resolve_path
from mixing.mixfile.phase import Phase, Transition, resolve_steps
from mixing.mixfile.suggest import nearest

__all__ = [
    "Cost",
    "Mix",
    "Phase",
    "SequenceSpec",
    "SourceSpec",
    "TokenizerSpec",
    "Transition",
    "load_mix",
    "parse_mix",
]


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
                raise FieldError(("tokenizer", "path"), f"{e}; expected a file's path") from None
            object.__setattr__(self, "tokenizer", self.tokenizer.model_copy(update={"path": shown}))
            object.__setattr__(self, "_tokenizer_path", written)
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> Mix:
        seen: set[str] = set()
        for i, ph in enumerate(self.curriculum):
            if ph.phase in seen:
                raise FieldError(("curriculum", i, "phase"), f"phase name {ph.phase!r} is used twice")
            seen.add(ph.phase)
            for src in ph.mixture:
                if src not in self.sources:
                    close = nearest(src, self.sources)
                    hint = f"did you mean {close!r}? " if close is not None else ""
                    raise FieldError(
                        ("curriculum", i, "mixture", src),
                        f"unknown source {src!r}; {hint}expected one of: {', '.join(sorted(self.sources))}",
                    )
            total = sum(ph.mixture.values())
            normalize = self.normalize if ph.normalize is None else ph.normalize
            if not normalize and not math.isclose(total, 1.0, abs_tol=1e-6):
                raise FieldError(
                    ("curriculum", i, "mixture"),
                    f"mixture weights sum to {total:g}; expected them to sum to 1 (or set normalize: true "
                    "to divide them by their sum)",
                )
            if ph.transition is not None and i == 0 and ph.transition.shape != "step":
                raise FieldError(
                    ("curriculum", 0, "transition"), "the first phase has no previous mixture to ramp from"
                )
        budget = self.balance.max_tokens
        if budget is not None and budget < self.sequence.length:
            raise FieldError(
                ("balance", "max_tokens"),
                f"{budget} tokens is less than one sequence; expected at least sequence.length {self.sequence.length}",
            )
        object.__setattr__(self, "_steps", resolve_steps(self.curriculum, self.sequence, self.balance.regroup))
        if sum(self._steps) > MAX_STEPS:
            big = max(range(len(self._steps)), key=self._steps.__getitem__)
            field = "tokens" if self.curriculum[big].tokens is not None else "steps"
            raise FieldError(
                ("curriculum", big, field),
                f"the run resolves to {sum(self._steps):,} steps ({self._steps[big]:,} in this phase); expected at "
                f"most {MAX_STEPS:,} steps",
            )
        if self.continues is not None:
            self._check_continues(self.continues)
        for i, (ph, n) in enumerate(zip(self.curriculum, self._steps, strict=True)):
            if ph.transition is not None and ph.transition.steps > n:
                raise FieldError(
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
        except FieldError as e:
            raise MixError(f"--at {at} --continue {base}: {e.msg}") from None
        return new

    def _check_continues(self, c: Continues) -> None:
        """``continues.at`` inside the run; ``continues.base`` resolved by the path rule (no ``{env_NAME}``)."""
        if c.at >= sum(self._steps):
            raise FieldError(("continues", "at"), f"step {c.at} is not before the run's end ({sum(self._steps)} steps)")
        if "{env_" in c.base:
            raise FieldError(("continues", "base"), "a base build's path cannot name {env_...} variables")
        object.__setattr__(self, "continues", c.model_copy(update={"base": resolve_path(c.base, self.mix_dir)}))

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
                return f"{self.path}:{self._lines[loc[:n]]}: {dotted(loc)}"
        return f"{self.path}:1: {dotted(loc)}"

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
    """The ``{env_NAME}`` variables of a path; raise :class:`FieldError` at ``loc`` for any other placeholder."""
    try:
        fields = [(f, conv, fmt) for _text, f, fmt, conv in string.Formatter().parse(text) if f is not None]
    except ValueError as e:
        raise FieldError(loc, f"{e} (write {{{{ and }}}} for a literal brace)") from None
    out = set()
    for field, conv, fmt in fields:
        m = envvars.PLACEHOLDER.fullmatch(f"{{{field}}}")
        if (field not in ("mix_dir", "stdlib") and not m) or conv or fmt:
            shown = field + (f"!{conv}" if conv else "") + (f":{fmt}" if fmt else "")
            raise FieldError(loc, f"unknown placeholder {{{shown}}}; expected {{mix_dir}}, {{stdlib}} or {{env_NAME}}")
        if m:
            if (why := envvars.refusal(m[1])) is not None:
                raise FieldError(loc, why)
            out.add(m[1])
    return out


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
        no_duplicate_keys(node, (), filename)
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
        raise validation_error(Mix, e, node, filename) from None
    except (ArithmeticError, RecursionError, TypeError, ValueError) as e:  # a safety net: never a traceback
        raise MixError(f"{filename}:1: cannot validate the mix file: {type(e).__name__}: {e}") from None
    object.__setattr__(mix, "_lines", field_lines(node))
    return mix
