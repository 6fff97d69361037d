"""``weir ui``: Dagster's dev services (``dg dev``) in a process group of their own, stopped whole when ``weir ui``
is stopped."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from pipelines import PROJECT_ROOT

__all__ = ["dagster_dev", "dev_command", "run_group"]

# Dagster 1.13's `dagster dev` warns on every start that it is superseded by `dg dev`. `dg dev` given a target
# (`-m MODULE`) starts the very same services (webserver, daemon, code server); without dagster-dg-cli (which the
# ui extra installs) `dagster dev` runs with that one warning filtered out: it asks for no action of the user.
_DG_DEV = "import sys; from dagster_dg_cli.cli import main; sys.exit(main())"
_DAGSTER_DEV = (
    "import sys, warnings; from dagster_shared.utils.warnings import SupersessionWarning; "
    "warnings.filterwarnings('ignore', category=SupersessionWarning); "
    "from dagster._cli import main; sys.exit(main())"
)


def dev_command(port: int, dg: bool | None = None) -> list[str]:
    """The command that serves the definitions (``pipelines.definitions``, code location of that name) on
    127.0.0.1:``port``: ``dg dev`` when ``dg`` (default: when dagster-dg-cli is installed), else ``dagster dev``
    without its supersession warning. Both run in this interpreter, so in this environment."""
    dg = importlib.util.find_spec("dagster_dg_cli") is not None if dg is None else dg
    args = ["dev", "-m", "pipelines.definitions", "-h", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-c", _DG_DEV if dg else _DAGSTER_DEV, *args]


def dagster_dev(port: int, home: Path, out: Console, err: Console) -> int:
    """Run the Dagster UI on 127.0.0.1:``port`` over the instance in ``home`` (:func:`dev_command` in
    :func:`run_group`); its exit status."""
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    return run_group(dev_command(port), env, out, err)


def run_group(cmd: list[str], env: dict[str, str], out: Console, err: Console, grace_s: float = 20.0) -> int:
    """Run ``cmd`` in its own process group until it exits or this process gets SIGINT, SIGTERM or SIGHUP.

    ``dg dev`` (as ``dagster dev``) starts a webserver, a daemon and code servers, all in its process group (none
    starts a session of its own). A signal to this process is passed on to the whole group, so stopping ``weir ui``
    stops every one of them and frees the port: the group gets ``grace_s`` seconds to shut down cleanly
    (SIGTERM), then SIGKILL; ``err`` says so when it comes to that, ``out`` says when a stop asked for is
    done. Returns the command's exit status, or 0 after a stop that was asked for.
    """
    asked: list[int] = []
    started: list[subprocess.Popen[bytes]] = []

    def stop(signum: int, _frame: object) -> None:
        asked.append(signum)
        for p in started:
            _signal_group(p.pid, signal.SIGTERM)

    # handlers first: a signal while the group starts must not leave it running without this process
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        proc = subprocess.Popen(cmd, env=env, cwd=PROJECT_ROOT, start_new_session=True)
    except BaseException:
        for s, handler in old.items():
            signal.signal(s, handler)
        raise
    started.append(proc)
    if asked:  # asked to stop while it was starting
        _signal_group(proc.pid, signal.SIGTERM)
    try:
        code = proc.wait()
    finally:
        _signal_group(proc.pid, signal.SIGTERM)  # what dagster dev left behind, or all of it on an error here
        deadline = time.monotonic() + grace_s
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _group_alive(proc.pid):
            err.print(f"[yellow]the Dagster processes did not stop within {grace_s:.0f} s; killing them[/]")
            _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        for s, handler in old.items():
            signal.signal(s, handler)
    if asked:
        out.print("stopped the Dagster UI (webserver, daemon and code servers)")
        return 0
    return code


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(pgid, signum)


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` is still alive (its leader, once exited, is a zombie until waited)."""
    for entry in os.scandir("/proc") if os.path.isdir("/proc") else ():
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    if not os.path.isdir("/proc"):  # no procfs (macOS): ask the kernel whether the group has members
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    return False
