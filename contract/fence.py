"""Fencing a build root shared by builds on several machines: at most one writer at a time publishes there.

While a :class:`Fence` is registered for a root (:func:`fenced`), every write and removal under it, through any
:class:`~contract.store.Store` of this process whose folder is in it, first asks the fence (:meth:`Fence.admit`),
which raises once this process may no longer write there; the store admits an upload just before it completes,
so a refused one leaves nothing behind. The registry is per process and shared by every thread; local folders
are never fenced (:func:`covering` is asked only for remote keys).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Protocol

from contract.redaction import redact_url

if TYPE_CHECKING:  # the store asks this module; it is never imported from here at run time
    from contract.store import Store

__all__ = ["Fence", "covering", "fenced"]


class Fence(Protocol):
    """What a writer must hold to write into a shared root: consulted before every write and removal there."""

    @property
    def generation(self) -> int:
        """The holder's generation (a number that grows with every new holder of the root), recorded in what
        it publishes."""
        ...

    def admit(self, name: str) -> None:
        """Return if this process may still write or remove ``name`` (``/``-separated, relative to the fenced
        root; a folder for a removal of a tree), else raise (a :class:`WeirError` that says why)."""
        ...


_FENCES: dict[tuple[str, str], Fence] = {}  # (protocol, root without protocol) -> its fence, for every thread
_FENCES_LOCK = threading.Lock()


@contextmanager
def fenced(store: Store, fence: Fence) -> Iterator[None]:
    """Have every write and removal under ``store``'s root in this process (by any :class:`Store` whose folder is
    in it) admitted by ``fence`` first, for the ``with`` block. One fence per root: nesting another raises;
    nesting the same one is allowed, and the root stays fenced until the outermost block ends."""
    key = (store.protocol, store.root.rstrip("/"))
    with _FENCES_LOCK:
        if key in _FENCES and _FENCES[key] is not fence:
            raise RuntimeError(f"{redact_url(store.url)} is fenced already")
        outermost = key not in _FENCES  # an inner block of the same fence must not unfence its outer one
        _FENCES[key] = fence
    try:
        yield
    finally:
        if outermost:
            with _FENCES_LOCK:
                _FENCES.pop(key, None)


def covering(protocol: str, path: str) -> tuple[Fence, str] | None:
    """The fence covering ``path`` (a key of a ``protocol`` filesystem, without the protocol) and ``path``
    relative to its root (``""`` for the root itself); None when no registered root holds it."""
    if not _FENCES:
        return None
    with _FENCES_LOCK:
        for (fenced_protocol, root), fence in _FENCES.items():
            if fenced_protocol == protocol and (path == root or path.startswith(root + "/")):
                return fence, path[len(root) + 1 :]
    return None
