"""The one rule for a path a mix file names (a source's ``uri``, ``tokenizer.path``): :func:`resolve_path`.

``{mix_dir}``, ``{stdlib}`` and ``{env_NAME}`` expanded, a relative local path taken relative to the mix file's
folder (not the current directory), local paths normalized; a URL (``s3://...``) kept as written. Pure: it
reads no file and no environment variable (the caller passes their values).
"""

from __future__ import annotations

import os
import re
import string
import sysconfig
from collections.abc import Mapping

__all__ = ["is_url", "resolve_path"]

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_url(path: str) -> bool:
    """Whether ``path`` is a ``scheme://`` URL (``s3://``, ``file://``), which :func:`resolve_path` keeps as written."""
    return bool(_URL.match(path))


def resolve_path(text: str, mix_dir: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> str:
    """The one rule for a path a mix file names (a source's ``uri``, ``tokenizer.path``).

    ``{mix_dir}`` becomes ``mix_dir``, ``{stdlib}`` this Python's standard library, ``{env_NAME}`` becomes
    ``env[NAME]`` (``env`` None: kept as written, the *shown* form). Then a local path (anything but a
    ``scheme://`` URL, which is returned as is) gets ``~`` expanded, is taken relative to ``mix_dir`` when
    relative, and is normalized (``os.path.normpath``): ``{mix_dir}/../x`` and the same file written another
    way give one string. In the shown form a path that starts with ``{env_NAME}`` is the variable's to make
    absolute, and a ``..`` never cancels a part holding ``{env_NAME}``. ``text`` must hold only those
    placeholders (the mix's validation checked them).
    """
    values = {"mix_dir": str(mix_dir), "stdlib": sysconfig.get_paths()["stdlib"]}
    for _lit, field, _spec, _conv in string.Formatter().parse(text):
        if field and field.startswith("env_"):
            values[field] = "{" + field + "}" if env is None else env[field[4:]]
    path = text.format(**values)
    if is_url(path):
        return path
    path = os.path.expanduser(path)
    if not os.path.isabs(path) and not path.startswith("{env_"):
        path = os.path.join(values["mix_dir"], path)
    return _normpath(path)


def _normpath(path: str) -> str:
    """``os.path.normpath``, except that a ``..`` never cancels a part holding an ``{env_NAME}`` placeholder."""
    if "{env_" not in path:
        return os.path.normpath(path)
    head = "/" if path.startswith("/") else ""
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == ".." and parts and parts[-1] != ".." and "{env_" not in parts[-1]:
            parts.pop()
        elif not (part == ".." and head and not parts):
            parts.append(part)
    return head + "/".join(parts) or "."
