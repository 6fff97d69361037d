"""The ``weir`` command's entry point: one line naming the extra to install where the factory is not installed.

``pip install weir`` installs the loader alone (what a training node needs) together with this command; the
commands themselves build, plan and show builds, so they need the ``build`` extra (``weir[ui]`` for ``weir ui``,
``weir[ray]`` for ``--engine ray``).
"""

from __future__ import annotations

import sys

__all__ = ["main"]

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
    app()
