"""Redaction of a build root's credentials from what is said about it: no message, log line or error names a
secret that a root's URL or storage options carry.

A URL's user info (``s3://KEY:SECRET@bucket``) is replaced by ``***`` (:func:`redact_url`); a message that may
quote a filesystem's own error (which can repeat what it was given) is scrubbed of every secret the URL and the
storage options hold (:func:`secrets_of`, :func:`scrub`). Pure string functions: deterministic, no I/O.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["has_user_info", "redact_url", "scrub", "secrets_of"]

_SECRET_OPTION = re.compile(r"key|secret|token|pass|cred|sas|auth", re.I)  # storage option names holding secrets
_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)([^/@]*|[^@]*:[^@]*)@", re.I)  # may hold an unescaped "/"


def redact_url(url: str) -> str:
    """``url`` without credentials (``s3://KEY:SECRET@bucket`` → ``s3://***@bucket``) for messages."""
    return _USERINFO.sub(r"\1***@", str(url))


def has_user_info(url: str) -> bool:
    """True when ``url`` carries user info (credentials) before its host: what :func:`redact_url` hides."""
    return _USERINFO.match(url) is not None


def secrets_of(url: str, options: dict[str, Any]) -> list[str]:
    """What a message about ``url`` must never show: the URL's user info (whole and each part) and the string
    values of storage options named like credentials, at any depth; the longest first, for :func:`scrub`."""
    found: list[str] = []
    if m := _USERINFO.match(url):
        found += [m.group(2), *m.group(2).split(":")]

    def walk(opts: dict[str, Any]) -> None:
        for k, v in opts.items():
            if isinstance(v, dict):
                walk(v)
            elif isinstance(v, str) and _SECRET_OPTION.search(str(k)):
                found.append(v)

    walk(options)
    return sorted({x for x in found if len(x) >= 4}, key=len, reverse=True)  # "t" is no secret anyone keeps


def scrub(text: str, secrets: list[str]) -> str:
    """``text`` with every one of ``secrets`` replaced by ``***``, in the order given (the longest first, so that
    a secret containing another is hidden whole)."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
