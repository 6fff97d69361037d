"""Streaming readers, one per source format: a file (any fsspec URI) in, :class:`Record` s out, in order.

Memory is bounded by one batch (``spec.batch_rows`` rows of parquet, a 1 MB block of csv, one line of
jsonl, one record of at most ``spec.max_record_bytes``), never by the file. Compression (``.gz``, ``.zst``,
``.bz2``, ``.xz``) is inferred from the file name. Nothing raises for bad data: a malformed record, or a
file that cannot be read (from where reading stopped), comes out as a :class:`Record` with ``error`` set.
A csv row that is not UTF-8 is quarantined alone; its neighbours are kept. In text ``separator`` mode every
piece between two separators is a record (an empty one is quarantined as ``empty document``); a blank tail
after the last separator is not a piece.

Line ends: ``\\n``, ``\\r\\n`` and a bare ``\\r`` each end a line, so each ends a jsonl record (a raw ``\\r`` cannot
be inside valid JSON: in a string it is escaped) and a csv row (quoted fields keep theirs), and line numbers
count them alike; a ``\\n`` in a text separator stands for any of them (:mod:`mixing.ingest.lines`).

Decoding: ``spec.encoding`` with ``spec.errors`` (strict: the record is quarantined as ``invalid UTF-8``
or, for another encoding, ``invalid encoding``). A UTF-8 byte-order mark at the start of a file (or tar
member) is skipped. Text holding a lone surrogate (a JSON ``"\\ud800"`` escape) is quarantined as
``invalid Unicode``; any other error one record's content causes (JSON nested too deeply, ...) is that
record's quarantine reason, never the file's or the build's.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import tarfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import IO, Any

import fsspec

from mixing.ingest.filenames import real_path
from mixing.ingest.lines import EOL, lines, separator_pattern
from mixing.ingest.records import Malformed, Record, bad, has_surrogate, needed_fields, render
from mixing.mixfile import envvars
from mixing.mixfile.mix import SourceSpec

__all__ = ["LANGUAGES", "READER_VERSION", "TAR_SUFFIXES", "is_code_file", "read_file"]

# Bumped whenever the records a reader yields for the same bytes change (part of every chunk key, so a
# rebuild never reuses chunks read the old way). 2: csv quarantines invalid UTF-8 per row; empty pieces
# between separators are counted as "empty document"; blank csv lines are rows. 3: a leading UTF-8 BOM
# is skipped; lone surrogates and content errors are quarantined; sources have an encoding. 4: \r and \r\n
# end jsonl records and csv rows, and a \n of a text separator matches any line end (files holding a \r are
# read differently; a build tokenizes every file again once, so that no chunk read the old way is reused).
READER_VERSION = 4
_BOM = codecs.BOM_UTF8

LANGUAGES = {
    ".py": "python", ".pyi": "python", ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp",
    ".rs": "rust", ".go": "go", ".java": "java", ".kt": "kotlin", ".scala": "scala", ".js": "javascript",
    ".ts": "typescript", ".rb": "ruby", ".php": "php", ".swift": "swift", ".cs": "csharp", ".lua": "lua",
    ".sh": "shell", ".sql": "sql", ".r": "r", ".jl": "julia", ".hs": "haskell", ".ml": "ocaml",
    ".html": "html", ".css": "css", ".md": "markdown", ".rst": "rst", ".toml": "toml", ".yaml": "yaml",
    ".yml": "yaml", ".json": "json", ".tex": "tex",
}  # fmt: skip
TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tar.xz")
_UNREADABLE: tuple[type[BaseException], ...] = (OSError, EOFError, ValueError, tarfile.TarError, csv.Error)
try:  # pyarrow and zstandard raise their own error types on corrupt input
    import pyarrow as pa
    import zstandard

    _UNREADABLE += (pa.ArrowException, zstandard.ZstdError)
except ImportError:  # pragma: no cover - both are dependencies
    pass


def is_code_file(path: str, spec: SourceSpec) -> bool:
    """Whether a code-tree source takes ``path``: a ``.tar`` or a file with a wanted extension."""
    low = path.lower()
    if low.endswith(TAR_SUFFIXES):
        return True
    suffix = PurePosixPath(low).suffix
    return suffix in spec.extensions if spec.extensions else suffix in LANGUAGES


def read_file(
    path: str,
    spec: SourceSpec,
    storage_options: dict[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    check: Callable[[Any], None] | None = None,
) -> Iterator[Record]:
    """Yield every record of ``path`` in order (see the module contract); never raises for bad data.

    ``path`` is shown (:func:`mixing.ingest.filenames.shown_path`): records name it so, and a name escaped
    there is opened by its bytes; its ``{env_NAME}`` are expanded with ``env`` first
    (:func:`mixing.mixfile.envvars.expand`). ``check`` is called with the file as opened (before any
    decompression) once it is open and again after its last record: what it raises is raised here, the
    records already yielded are then not the file's whole.
    """
    line = 0
    try:
        real = real_path(envvars.expand(path, env))
        opened = fsspec.open(real, "rb", compression="infer", **(storage_options or {}))
        if check is not None:  # the object's details as it is now, not as a listing in this process cached them
            opened.fs.invalidate_cache(opened.path)
        with opened as f:
            raw = opened.fobjects[0]  # the file itself, under a decompressor if any
            if check is not None:
                check(raw)
            buffered = _buffered(f)  # held until the end check: a buffer collected closes the file under it
            for rec in _READERS[spec.format](path, buffered, spec):
                line = rec.line
                yield rec
            if check is not None:
                check(raw)
            del buffered
    except _UNREADABLE as e:
        yield bad(path, line + 1 if line else 0, "unreadable file", envvars.redact(f"{type(e).__name__}: {e}"))


def _buffered(f: Any) -> IO[bytes]:
    """Decompressors (zstd) may lack a fast ``readline``; a buffer gives every stream one."""
    buffered = f if isinstance(f, io.BufferedIOBase) else io.BufferedReader(f, 1 << 20)
    return buffered  # type: ignore[return-value]


def _record(path: str, line: int, rec: Any, spec: SourceSpec) -> Record:
    try:
        text, meta = render(rec, spec)
    except Malformed as e:
        return bad(path, line, e.reason, str(e).split(": ", 1)[1], _sample(rec))
    except Exception as e:  # anything else this record's content caused is its own reason, not the build's
        return bad(path, line, "invalid record", f"{type(e).__name__}: {e}", _sample(rec))
    return _checked(path, line, text, spec, meta)


def _sample(rec: Any) -> str:
    try:
        return json.dumps(rec, default=str)[:400]
    except (ValueError, TypeError, RecursionError):  # too deep, or a circular value
        return repr(rec)[:400] if not isinstance(rec, dict | list) else f"<{type(rec).__name__}>"


def _checked(path: str, line: int, text: str, spec: SourceSpec, meta: str | None = None) -> Record:
    if not text.isascii() and has_surrogate(text):  # no UTF-8 for it: every tokenizer would fail on it
        at = next(i for i, c in enumerate(text) if "\ud800" <= c <= "\udfff")
        return bad(path, line, "invalid Unicode", f"lone surrogate U+{ord(text[at]):04X} at character {at}", text)
    if not text.strip():
        return bad(path, line, "empty document", "the text is empty or only whitespace", text)
    if len(text) > spec.max_record_bytes // 4 and len(text.encode("utf-8")) > spec.max_record_bytes:
        return bad(path, line, "record too large", f"text over max_record_bytes={spec.max_record_bytes}", text)
    return Record(path, line, text, meta=meta)


def _is_utf8(spec: SourceSpec) -> bool:
    return codecs.lookup(spec.encoding).name in ("utf-8", "utf-8-sig")


def _decode(path: str, line: int, raw: bytes, spec: SourceSpec, where: str = "") -> str | Record:
    """``raw`` decoded as the source says, or the record that quarantines it (``where``: its column)."""
    try:
        return raw.decode(spec.encoding, spec.errors)
    except UnicodeDecodeError as e:
        if _is_utf8(spec):
            return bad(path, line, "invalid UTF-8", f"{where}byte {e.start}", raw)
        return bad(path, line, "invalid encoding", f"{where}not {spec.encoding} at byte {e.start}", raw)


def _strip_bom(raw: bytes, spec: SourceSpec) -> bytes:
    return raw[len(_BOM) :] if raw.startswith(_BOM) and _is_utf8(spec) else raw


def _jsonl(path: str, f: IO[bytes], spec: SourceSpec) -> Iterator[Record]:
    limit = spec.max_record_bytes
    n = 0
    for raw, size in lines(f, limit):
        n += 1
        if size:
            yield bad(path, n, "record too large", f"{size} bytes > max_record_bytes={limit}", raw)
            continue
        if n == 1:
            raw = _strip_bom(raw, spec)
        if not raw.strip():
            continue
        text = _decode(path, n, raw, spec)
        if isinstance(text, Record):
            yield text
            continue
        try:
            rec = json.loads(text)
        except json.JSONDecodeError as e:
            yield bad(path, n, "invalid JSON", str(e), raw)
            continue
        except RecursionError:
            yield bad(path, n, "invalid JSON", "nested too deeply to parse", raw)
            continue
        yield _record(path, n, rec, spec)


def _parquet(path: str, f: IO[bytes], spec: SourceSpec) -> Iterator[Record]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(f)
    have = set(pf.schema_arrow.names)
    cols = [c for c in needed_fields(spec) if c in have]
    row = 0
    for batch in pf.iter_batches(batch_size=spec.batch_rows, columns=cols):
        for rec in batch.to_pylist():
            row += 1
            yield _record(path, row, rec, spec)


def _csv(path: str, f: IO[bytes], spec: SourceSpec) -> Iterator[Record]:
    import pyarrow as pa
    import pyarrow.csv as pcsv

    header = _strip_bom(EOL.split(f.readline(spec.max_record_bytes + 1), maxsplit=1)[0], spec)  # \r ends it too
    names = next(csv.reader([header.decode(spec.encoding, "replace")]), [])
    f.seek(0)
    if not _is_utf8(spec):  # pyarrow reads UTF-8 only: Python's csv module decodes other encodings
        yield from _csv_rows(path, f, spec, names, skip=(0, 0))
        return
    invalid: list[Record] = []

    def on_invalid(row: Any) -> str:
        invalid.append(bad(path, row.number or 0, "invalid CSV row", row.text[:80], row.text))
        return "skip"

    # Columns are read as binary: a string column would make pyarrow reject a whole block for one row
    # of invalid UTF-8 (and the reader cannot go on after it). Each batch is then validated at once by a
    # cast, and only a batch that fails is decoded row by row, so a bad row is quarantined alone.
    row = quarantined = 0
    try:
        reader = pcsv.open_csv(
            f,
            read_options=pcsv.ReadOptions(block_size=1 << 20, use_threads=False),
            parse_options=pcsv.ParseOptions(  # a blank line is a row too (an empty document or a short row)
                newlines_in_values=True, ignore_empty_lines=False, invalid_row_handler=on_invalid
            ),
            convert_options=pcsv.ConvertOptions(
                column_types=dict.fromkeys(names, pa.binary()),
                include_columns=[c for c in needed_fields(spec) if c in names],  # as parquet: only those read
            ),
        )
        for batch in reader:
            yield from invalid
            quarantined += len(invalid)
            invalid.clear()
            try:
                rows = batch.cast(pa.schema([(n, pa.string()) for n in batch.schema.names])).to_pylist()
            except pa.ArrowInvalid:  # some row of this batch is not UTF-8
                rows = batch.to_pylist()
            for rec in rows:
                row += 1
                yield _csv_record(path, row, rec, spec)
    except pa.ArrowInvalid:  # pyarrow cannot go on (a malformed row that is not UTF-8 either)
        f.seek(0)
        yield from _csv_rows(path, f, spec, names, skip=(row, quarantined))
        return
    yield from invalid


def _csv_rows(path: str, f: IO[bytes], spec: SourceSpec, names: list[str], skip: tuple[int, int]) -> Iterator[Record]:
    """The slow path: Python's csv reader, one row at a time, after the ``skip`` (rows, malformed rows)
    pyarrow already yielded. Bytes that are not UTF-8 survive as surrogates and mark their row."""
    # A field may be as large as a record can be; the limit is process-wide, so it only ever grows.
    csv.field_size_limit(max(csv.field_size_limit(), spec.max_record_bytes + 1))
    encoding = "utf-8-sig" if _is_utf8(spec) else spec.encoding  # -sig: a leading BOM is skipped
    text = io.TextIOWrapper(f, encoding=encoding, errors="surrogateescape", newline="")
    reader = csv.reader(text)
    next(reader, None)  # the header
    row, quarantined = 0, 0
    wanted = [c for c in needed_fields(spec) if c in names] or names
    for fields in reader:
        if fields and len(fields) != len(names):
            quarantined += 1
            if quarantined > skip[1]:
                raw = ",".join(fields).encode(spec.encoding, "surrogateescape")
                yield bad(path, reader.line_num, "invalid CSV row", raw[:80].decode("utf-8", "replace"), raw)
            continue
        row += 1
        if row > skip[0]:
            rec = dict(zip(names, fields, strict=True)) if fields else dict.fromkeys(names, "")
            # Only the fields the text reads, as on the fast path: bad bytes elsewhere spoil nothing.
            yield _csv_record(path, row, {k: _surrogate_bytes(rec[k], spec) for k in wanted}, spec)


def _surrogate_bytes(v: str, spec: SourceSpec) -> str | bytes:
    if v.isascii() or not has_surrogate(v):
        return v
    return v.encode(spec.encoding, "surrogateescape")  # the file's bytes, decoded again by _csv_record


def _csv_record(path: str, row: int, rec: dict[str, Any], spec: SourceSpec) -> Record:
    for k, v in rec.items():
        if isinstance(v, bytes):  # only in a batch that failed to validate as UTF-8 (or another encoding)
            text = _decode(path, row, v, spec, f"column {k!r}, ")
            if isinstance(text, Record):
                return text
            rec[k] = text
    return _record(path, row, rec, spec)


def _text(path: str, f: IO[bytes], spec: SourceSpec) -> Iterator[Record]:
    limit = spec.max_record_bytes
    if spec.separator is None:
        raw = f.read(limit + 1)
        if len(raw) > limit:
            yield bad(path, 0, "record too large", f"file over max_record_bytes={limit}", raw)
            return
        text = _decode(path, 0, _strip_bom(raw, spec), spec)
        yield text if isinstance(text, Record) else _checked(path, 0, text, spec)
        return
    sep, eol = separator_pattern(spec.separator)
    buf, piece, skipping = b"", 0, False
    chunk = _strip_bom(f.read(1 << 20), spec)
    while True:
        data, held = buf + chunk, b""
        if eol and chunk and data.endswith(b"\r"):  # it may start a \r\n: split with what follows
            data, held = data[:-1], b"\r"
        parts = sep.split(data)
        buf = parts.pop() + held if chunk else b""  # at the end of the file the last part is a piece too
        last = len(parts) - 1 if not chunk else -1
        for i, raw in enumerate(parts):
            piece += 1
            if skipping:  # the tail of a piece already counted as too large
                skipping = False
            elif i == last and not raw.strip():
                piece -= 1  # what follows the last separator is no piece when blank: it ended the file
            else:  # an empty piece between two separators is counted (quarantined), never skipped
                text = _decode(path, piece, raw, spec)
                yield text if isinstance(text, Record) else _checked(path, piece, text, spec)
        if len(buf) > limit:
            if not skipping:
                yield bad(path, piece + 1, "record too large", f"piece over max_record_bytes={limit}", buf)
            buf, skipping = b"", True
        if not chunk:
            return
        chunk = f.read(1 << 20)


def _code(path: str, f: IO[bytes], spec: SourceSpec) -> Iterator[Record]:
    if not path.lower().endswith(TAR_SUFFIXES):
        yield _code_doc(path, 0, path, f.read(spec.max_record_bytes + 1), spec)
        return
    with tarfile.open(fileobj=f, mode="r|*") as tar:  # streaming: members in archive order
        for i, member in enumerate(tar, start=1):
            if not member.isfile() or not is_code_file(member.name, spec) or member.name.endswith(TAR_SUFFIXES):
                continue
            if member.size > spec.max_record_bytes:
                yield bad(path, i, "record too large", f"{member.name}: {member.size} bytes", member.name)
                continue
            data = tar.extractfile(member)
            yield _code_doc(path, i, member.name, data.read() if data else b"", spec)


def _code_doc(path: str, line: int, name: str, raw: bytes, spec: SourceSpec) -> Record:
    if len(raw) > spec.max_record_bytes:
        return bad(path, line, "record too large", f"{name}: over max_record_bytes", raw)
    text = _decode(path, line, _strip_bom(raw, spec), spec)
    if isinstance(text, Record):
        return text
    lang = LANGUAGES.get(PurePosixPath(name.lower()).suffix, "unknown")
    return _checked(path, line, text, spec, json.dumps({"path": name, "language": lang}))


_READERS = {"jsonl": _jsonl, "parquet": _parquet, "csv": _csv, "text": _text, "code": _code}
