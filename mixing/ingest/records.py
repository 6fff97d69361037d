"""Records: one document's text (or the reason it is malformed) and how a record's fields make that text.

A source names its text in one of three ways (see :class:`mixing.mixfile.mix.SourceSpec`): a ``field``, a
Python-format ``template`` over several fields (nested values by ``{a[b]}``), or a ``messages`` field
holding a chat (a list of ``{role, content}``) rendered by a named ``chat_template``. Rendering is pure
and deterministic; a problem is reported as a :class:`Malformed` whose ``reason`` is one of
:data:`REASONS`, never raised past the reader.
"""

from __future__ import annotations

import json
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mixing.mixfile.mix import SourceSpec

__all__ = [
    "CHAT_TEMPLATES",
    "REASONS",
    "Malformed",
    "Record",
    "bad",
    "chat_markers_warning",
    "has_surrogate",
    "needed_fields",
    "render",
]

# Every quarantine reason; a record's ``error`` always starts with one of them followed by ": ".
REASONS = (
    "invalid JSON",
    "invalid UTF-8",
    "invalid CSV row",
    "not an object",
    "missing field",
    "not a string",
    "invalid messages",
    "template error",
    "empty document",
    "record too large",
    "unreadable file",
    "invalid encoding",  # not the source's own ``encoding`` (other than UTF-8)
    "invalid Unicode",  # a lone surrogate (a "\\ud800" JSON escape): no UTF-8 text, no tokens
    "invalid record",  # any other error a record's content caused (the detail names it)
    # Paths the source's URI matched that are not read (see mixing.ingest.sources.index_source):
    "dangling symlink",
    "symlink loop",
    "is a directory",
    "not a regular file",
)

_SAMPLE_CHARS = 200  # how much of a bad record the quarantine file keeps


@dataclass(frozen=True)
class Record:
    """One record of a source file: ``text`` after rendering, or ``error`` (``"<reason>: <detail>"``).

    ``line`` is the 1-based line (jsonl), row (parquet, csv), piece (text with a separator) or tar member
    index; 0 for a whole-file document or a file that could not be read. ``meta`` is the JSON of the
    kept metadata (or None); ``sample`` is the start of a malformed record, for the quarantine file.
    """

    file: str
    line: int
    text: str | None
    error: str | None = None
    meta: str | None = None
    sample: str | None = None

    @property
    def reason(self) -> str | None:
        return None if self.error is None else self.error.split(":", 1)[0]


class Malformed(ValueError):
    """A record that cannot become a document; ``reason`` is one of :data:`REASONS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


def bad(file: str, line: int, reason: str, detail: str, sample: object = None) -> Record:
    """A malformed record with a short printable sample of what was read."""
    assert reason in REASONS, reason
    if isinstance(sample, bytes):
        sample = sample[: _SAMPLE_CHARS * 4].decode("utf-8", "replace")
    text = None if sample is None else _printable(str(sample)[:_SAMPLE_CHARS])
    return Record(file, line, None, f"{reason}: {_printable(detail)}", sample=text)


def _printable(s: str) -> str:
    """``s`` with lone surrogates escaped (``\\ud800``), so that the quarantine file can be UTF-8."""
    return s if s.isascii() else s.encode("utf-8", "backslashreplace").decode("utf-8")


def _chatml(msgs: list[tuple[str, str]]) -> str:
    return "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in msgs)


def _plain(msgs: list[tuple[str, str]]) -> str:
    return "\n\n".join(f"{r.capitalize()}: {c}" for r, c in msgs)


def _llama3(msgs: list[tuple[str, str]]) -> str:
    return "".join(f"<|start_header_id|>{r}<|end_header_id|>\n\n{c}<|eot_id|>" for r, c in msgs)


CHAT_TEMPLATES = {"chatml": _chatml, "plain": _plain, "llama3": _llama3}
# The markers each template writes; a tokenizer meant for the template has each as one special token.
CHAT_MARKERS = {
    "chatml": ("<|im_start|>", "<|im_end|>"),
    "plain": (),
    "llama3": ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
}


def chat_markers_warning(name: str, spec: SourceSpec, pieces: Callable[[str], int]) -> str | None:
    """One line when source ``name`` renders chats with markers its tokenizer lacks, else None.

    ``pieces(text)`` is how many tokens the tokenizer makes of ``text``: a marker it does not know as one
    special token comes out in several pieces, so the chat is trained on as plain text spelling
    ``<|im_start|>``; nothing fails, which is why this warns.
    """
    if spec.messages is None:
        return None
    lacking = [m for m in CHAT_MARKERS[spec.chat_template] if pieces(m) != 1]
    if not lacking:
        return None
    return (
        f"source {name!r}: chat_template {spec.chat_template!r} writes {', '.join(lacking)}, which the tokenizer "
        f"does not have as special tokens, so they become plain text ({pieces(lacking[0])} tokens each); use a "
        "tokenizer that has them, or chat_template: plain"
    )


def needed_fields(spec: SourceSpec) -> list[str]:
    """Top-level fields the text and metadata of ``spec`` read (so columnar readers read only those)."""
    if spec.messages is not None:
        names = [spec.messages]
    elif spec.template is not None:
        names = []
        for _lit, name, _fmt, _conv in string.Formatter().parse(spec.template):
            if name:
                root = name.split(".", 1)[0].split("[", 1)[0]
                if root and not root.isdigit():
                    names.append(root)
    else:
        names = [spec.field]
    return list(dict.fromkeys([*names, *spec.metadata]))


def render(rec: Any, spec: SourceSpec) -> tuple[str, str | None]:
    """The text and metadata JSON of one record (a mapping of fields); raises :class:`Malformed`."""
    if not isinstance(rec, Mapping):
        raise Malformed("not an object", f"expected an object of fields, got {type(rec).__name__}")
    if spec.messages is not None:
        text = _render_chat(rec, spec.messages, spec.chat_template)
    elif spec.template is not None:
        try:  # the template names fields and indexes them, nothing else (SourceSpec validates it)
            text = spec.template.format_map(rec)
        except KeyError as e:
            raise Malformed("missing field", f"template field {e} is missing") from None
        except IndexError as e:
            raise Malformed("missing field", f"template index out of range ({e})") from None
        except (ValueError, TypeError, AttributeError, OverflowError, RecursionError, MemoryError) as e:
            raise Malformed("template error", f"{type(e).__name__}: {e}") from None
    else:
        if spec.field not in rec or rec[spec.field] is None:
            raise Malformed("missing field", f"field {spec.field!r} is missing")
        text = rec[spec.field]
        if not isinstance(text, str):
            raise Malformed("not a string", f"field {spec.field!r} is a {type(text).__name__}")
    meta = None
    if spec.metadata:
        kept = {k: rec.get(k) for k in spec.metadata}
        meta = json.dumps(kept, default=str, ensure_ascii=False)
        if not meta.isascii() and has_surrogate(meta):  # escaped instead: the JSON means the same
            meta = json.dumps(kept, default=str)
    return text, meta


def has_surrogate(s: str) -> bool:
    """Whether ``s`` holds a lone surrogate (no UTF-8 encoding exists for it)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _render_chat(rec: Mapping[str, Any], field: str, template: str) -> str:
    msgs = rec.get(field)
    if msgs is None:
        raise Malformed("missing field", f"messages field {field!r} is missing")
    if not isinstance(msgs, list) or not msgs:
        raise Malformed("invalid messages", f"field {field!r} is not a non-empty list of messages")
    pairs = []
    for i, m in enumerate(msgs):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise Malformed("invalid messages", f"{field}[{i}] needs string 'role' and 'content'")
        pairs.append((m["role"], m["content"]))
    return CHAT_TEMPLATES[template](pairs)
