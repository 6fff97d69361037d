"""The ``weir`` command's entry point: one line naming the extra to install where the factory is not installed.

``pip install weir`` installs the loader alone (what a training node needs) together with this command; the
commands themselves build, plan and show builds, so they need the ``build`` extra (``weir[ui]`` for ``weir ui``,
``weir[ray]`` for ``--engine ray``). Every command ends as soon as it is done (:func:`run_and_exit`).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable

__all__ = ["main", "run_and_exit"]

# what the build extra installs, by import name: a missing one means the extra is missing, not a bug of weir's
_BUILD_EXTRA = frozenset(
    {"dagster", "duckdb", "matplotlib", "numba", "polars", "pyarrow", "yaml", "rich", "tiktoken", "tokenizers"}
    | {"typer", "zstandard", "s3fs"}
)


def main() -> None:
    """Run the CLI; without the build extra, exit 2 with one line saying what to install."""
    try:
        from pipelines.cli import app
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in _BUILD_EXTRA:
            raise
        print(
            f"weir: the weir command needs the build extra ({e.name} is not installed): pip install 'weir[build]' "
            "(a training node needs none of it: it imports loaders)",
            file=sys.stderr,
        )
        sys.exit(2)
    run_and_exit(app)


def run_and_exit(command: Callable[[], object]) -> None:
    """Run ``command`` (a CLI app, which ends in ``SystemExit``) and end the process with its status at once.

    What Python does at exit that weir needs still happens, in Python's order: other threads that are not
    daemons are waited for, the ``atexit`` handlers run (logging's flush, Ray's shutdown, temporary folders'
    removal), stdout and stderr are flushed (a flush that fails turns success into 120, as Python's does). What is
    skipped is the interpreter's teardown, which frees every object of every loaded module one by one: about a
    second after a build (Dagster's, numba's, polars' objects), which every ``weir`` command paid after its last
    line. Nothing of weir's is left to it: every file and database is closed by its ``with``. An exception other
    than ``SystemExit`` is raised as it is (Python prints it and exits 1, tearing down as usual); under a profiler
    or a tracer (``python -m cProfile``, coverage, a debugger), which write what they saw as Python ends, the
    command ends as Python ends it.
    """
    try:
        command()
        status: object = 0
    except SystemExit as e:
        status = e.code
    if status is None:
        status = 0
    elif not isinstance(status, int):  # sys.exit("message"): Python prints it and exits 1
        print(status, file=sys.stderr)
        status = 1
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(status)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe (weir inspect | head)
        status = status or 120
    os._exit(status)
