"""Where a run's steps execute: every step in its own process by default, or all in the run's process.

The choice is configuration, not code: ``WEIR_EXECUTOR`` picks the executor when the definitions load,
and the chosen executor's own settings come from the run config's ``execution: config:`` block.

===============  ============================================================================
``WEIR_EXECUTOR``  executor
===============  ============================================================================
``multiprocess``   (default) every step in its own process on this machine, up to
                   ``WEIR_MAX_CONCURRENT`` steps at once (default: one per CPU)
``in_process``     every step in the run's own process (debugging, tiny mixes)
===============  ============================================================================

A build's heavy work does not scale with the executor but with the ``engine`` resource
(:mod:`assets.engine`): the steps submit tokenizing and shard writing to a Ray cluster.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import dagster as dg

from contract.errors import WeirError

__all__ = ["EXECUTORS", "ExecutorChoiceError", "executor_from_env"]

EXECUTORS = ("multiprocess", "in_process")


class ExecutorChoiceError(WeirError, ValueError):
    """``WEIR_EXECUTOR`` names no known executor, or one whose package is not installed."""


def executor_from_env(env: Mapping[str, str] = os.environ) -> dg.ExecutorDefinition:
    """The executor ``WEIR_EXECUTOR`` names (default ``multiprocess``); raises :class:`ExecutorChoiceError`."""
    kind = env.get("WEIR_EXECUTOR", "multiprocess").strip() or "multiprocess"
    if kind == "multiprocess":
        limit = env.get("WEIR_MAX_CONCURRENT", "")
        if not limit:
            return dg.multiprocess_executor
        if not (limit.isascii() and limit.isdigit()):
            raise ExecutorChoiceError(f"WEIR_MAX_CONCURRENT={limit!r}: expected a whole number of processes")
        return dg.multiprocess_executor.configured({"max_concurrent": int(limit)}, name="multiprocess")
    if kind == "in_process":
        return dg.in_process_executor
    raise ExecutorChoiceError(f"WEIR_EXECUTOR={kind!r}: expected one of {', '.join(EXECUTORS)}")
