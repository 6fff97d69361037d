"""Dagster definitions, the in-process build and the ``weir`` CLI (the top layer)."""

from pathlib import Path

__all__ = ["PROJECT_ROOT"]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
"""The checkout's root: where ``mixes/``, ``build/`` and the project's ``.dagster_home`` are by default."""
