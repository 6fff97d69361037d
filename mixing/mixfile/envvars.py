"""Environment variables in paths (a source's ``uri``, ``tokenizer.path``): ``{env_NAME}`` is expanded only
where a file is listed or opened, and its value is never shown.

A mix file may write ``uri: "{env_DATA_ROOT}/web/*.jsonl"``. The value of ``DATA_ROOT`` reaches fsspec and
nothing else: the source index, the documents' ``file`` column, quarantine records, messages, Dagster
metadata and the event log hold ``{env_DATA_ROOT}/web/x.jsonl`` (the *shown* form of a path), and
:func:`expand` turns that back into the real path at the moment a file is opened.

Which variables: any whose name does not look like a credential (:func:`refusal`). Keys, tokens and
passwords go to the storage resource (``AWS_*`` variables bound as Dagster ``EnvVar``), never into a path.

The names come from every mix file validated in this process (:func:`register`) and every placeholder
:func:`expand` expanded in it; :func:`redact` replaces their current values, longest first, in any text.
A path that holds a value in another spelling than the variable's (fsspec normalizing ``a//b``) is covered for
the normalized spelling of a local path too.

Another process (a Ray worker, whose environment is its cluster's, not the driver's) opens the files a driver
listed with the driver's values: :func:`shipped` takes them where the files were listed, they travel with the
work, and :func:`expand` given them (``env``) prefers them to the worker's own, so that every process opens the
files the index lists. Values expanded so are hidden by :func:`redact` in that process from then on.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping

__all__ = ["PLACEHOLDER", "expand", "redact", "refusal", "register", "replacements", "shipped"]

PLACEHOLDER = re.compile(r"\{env_([A-Za-z_][A-Za-z0-9_]*)\}")
_CREDENTIAL = re.compile(r"SECRET|PASSW|TOKEN|CREDENTIAL|PRIVATE|SESSION|AUTH|(^|_)(API_?|ACCESS_?)?KEY($|_)", re.I)
_NAMES: set[str] = set()  # every variable a validated mix file refers to (process-wide, only grows)
_SHIPPED: dict[str, str] = {}  # value -> placeholder of every value expand() took from a shipped env (only grows)


def refusal(name: str) -> str | None:
    """Why ``{env_<name>}`` may not be used in a URI, or None when it may."""
    if _CREDENTIAL.search(name):
        return (
            f"{{env_{name}}} looks like a credential; expected a variable naming a place (credentials go to the "
            "storage resource's AWS_* variables, never into a path)"
        )
    return None


def register(names: set[str]) -> None:
    """Record variables a mix file expands, so that :func:`redact` hides their values from now on."""
    _NAMES.update(names)


def replacements() -> list[tuple[str, str]]:
    """``(value spelling, placeholder)`` of every registered variable that is set, longest spelling first."""
    out: dict[str, str] = {}
    for name in sorted(_NAMES):
        value = os.environ.get(name)
        if not value:
            continue
        for v in {value, value.rstrip("/"), os.path.normpath(value) if value.startswith("/") else value}:
            if v:
                out.setdefault(v, f"{{env_{name}}}")
    return sorted(out.items(), key=lambda kv: (-len(kv[0]), kv[0]))


def redact(text: str) -> str:
    """``text`` with every registered variable's value, and every value :func:`expand` took from a shipped
    ``env`` in this process, replaced by its ``{env_NAME}`` placeholder (longest first)."""
    pairs = dict(replacements())
    for value, placeholder in _SHIPPED.items():
        for v in {value, value.rstrip("/"), os.path.normpath(value) if value.startswith("/") else value}:
            if v:
                pairs.setdefault(v, placeholder)
    for value, placeholder in sorted(pairs.items(), key=lambda kv: (-len(kv[0]), kv[0])):
        text = text.replace(value, placeholder)
    return text


def shipped(texts: Iterable[str]) -> dict[str, str]:
    """``{NAME: value}`` in this process of every variable whose placeholder is in ``texts`` and that
    :func:`expand` would expand here: what another process needs to open these paths as this one does.

    For the work handed to other processes only (a secret never has such a name, :func:`refusal`); never show it.
    """
    names = {m[1] for text in texts if "{env_" in text for m in PLACEHOLDER.finditer(text)}
    return {n: os.environ[n] for n in sorted(names) if n in os.environ and refusal(n) is None}


def expand(text: str, env: Mapping[str, str] | None = None) -> str:
    """The real path of a shown one: each placeholder of a variable that is set and may be used (:func:`refusal`)
    replaced by its value, others kept.

    ``env``: values shipped by the process that listed the path (:func:`shipped`), taken before this process's
    own environment: a Ray worker's environment is its cluster's, which may lack the variable or hold another
    value. Without ``env``, any such variable of this process, not only those of a mix file validated in it: a
    Dagster step process opens a path it was handed, shown, without having validated the mix. A variable
    expanded here is registered (a shipped value recorded), so that this process's messages hide its value too.
    """
    if "{env_" not in text:
        return text

    def value(m: re.Match[str]) -> str:
        name = m[1]
        if refusal(name) is not None:
            return m[0]
        if env is not None and name in env and env[name] != os.environ.get(name):
            _SHIPPED[env[name]] = m[0]  # another process's value: hidden here from now on
            return env[name]
        if name not in os.environ:
            return m[0]
        _NAMES.add(name)
        return os.environ[name]

    return PLACEHOLDER.sub(value, text)
