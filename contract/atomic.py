"""Writing a local file so that a reader sees either the old file or the whole new one, never a part."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["atomic_path", "file_mode", "write_json_atomic"]


@contextmanager
def atomic_path(final: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; on success rename it over ``final`` (atomic on POSIX).

    On error the temporary file is removed, so readers see either the old file or the complete new one.
    The file is created with mode 0666 less the umask, like any ``open(..., "w")`` (``tempfile.mkstemp``
    would make it 0600, unreadable by a trainer running as another user).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = final.parent / f".{final.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the kernel applies the umask
        except FileExistsError:  # a name another writer just took: draw again
            continue
        os.close(fd)
        break
    try:
        yield Path(tmp)
        os.replace(tmp, final)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def file_mode() -> int:
    """The mode a new file gets now: 0666 less the process's umask (read without changing it where possible)."""
    try:
        with open("/proc/self/status") as f:  # Linux: the umask, without a window where it is changed
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        umask = os.umask(0o22)
        os.umask(umask)
    return 0o666 & ~umask


def write_json_atomic(final: Path, obj: Any) -> None:
    with atomic_path(final) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
