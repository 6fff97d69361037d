"""The project's Dagster instance: where ``weir ui`` looks and where ``weir build`` records its runs.

``$DAGSTER_HOME`` when it is set (Dagster's own convention, so a deployment's instance is used), else
``.dagster_home/`` in the project. Both commands choose it here, so a build made on the command line shows
in the UI with its checks and plots.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import dagster as dg

from pipelines import PROJECT_ROOT

__all__ = ["dagster_home", "project_instance"]


def dagster_home(home: Path | None = None) -> Path:
    """``home``, else ``$DAGSTER_HOME``, else ``<project>/.dagster_home``; created with a ``dagster.yaml``
    (telemetry off) when it has none."""
    chosen = home or Path(os.environ.get("DAGSTER_HOME") or PROJECT_ROOT / ".dagster_home")
    chosen = chosen.expanduser().resolve()
    chosen.mkdir(parents=True, exist_ok=True)
    cfg = chosen / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text("telemetry:\n  enabled: false\n")
    return chosen


def project_instance(home: Path | None = None) -> dg.DagsterInstance:
    """The instance in :func:`dagster_home`, its storage created (under a lock) before it is returned.

    Two processes creating an instance's fresh SQLite files at once leave them broken ("more than one
    head"): concurrent builds, or a build started while ``weir ui`` starts, take turns here.
    """
    folder = dagster_home(home)
    with open(folder / ".weir-init.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        instance = dg.DagsterInstance.from_config(str(folder))
        instance.get_runs(limit=1)  # creates the run, event log and schedule storage if absent
        instance.get_latest_materialization_event(dg.AssetKey(["weir"]))
        instance.all_instigator_state()
    return instance
