"""Stopping ``weir ui`` (SIGTERM, or SIGINT as Ctrl-C sends it) stops the webserver, daemon and code servers it
started and frees the port: nothing of it is left running."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TINY_MIX, write_tiny_sources

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="finds leftover processes through /proc"),
]
MARKER = "WEIR_UI_STOP_TEST"  # set in the environment of weir ui, inherited by everything it starts


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def _marked(token: str) -> list[int]:
    """Live processes (not zombies) whose environment holds ``MARKER=token``: weir ui and all it started."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if f"{MARKER}={token}".encode() in environ.split(b"\0") and stat[stat.rindex(")") + 2] != "Z":
            found.append(int(entry.name))
    return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stopping_weir_ui_stops_every_dagster_process_and_frees_the_port(tmp_path: Path, signum: int) -> None:
    write_tiny_sources(tmp_path / "data")
    mixes = tmp_path / "mixes"
    mixes.mkdir()
    (mixes / "tiny.yaml").write_text(TINY_MIX.format(root=tmp_path / "data"))
    port, token = _free_port(), f"{os.getpid()}-{signum}"
    env = {
        **os.environ,
        "WEIR_MIXES": str(mixes),
        "WEIR_BUILD_ROOT": str(tmp_path / "build"),
        "WEIR_AUTOMATION": "off",
        MARKER: token,
    }
    cmd = [sys.executable, "-m", "pipelines.cli", "ui", "--port", str(port), "--home", str(tmp_path / "home")]
    log = tmp_path / "ui.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not _answers(port):
            assert proc.poll() is None, f"weir ui exited with {proc.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the UI never answered on {port}:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        started = _marked(token)
        assert len(started) >= 3, started  # weir, dagster dev, the webserver (and the daemon, code servers)
        proc.send_signal(signum)  # to weir alone, as `kill` or a terminal's Ctrl-C (weir is the foreground)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        deadline = time.monotonic() + 10
        while (_marked(token) or _answers(port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _marked(token) == [], f"left running: {_marked(token)}\n{log.read_text()[-3000:]}"
        assert not _answers(port)
        assert "stopped the Dagster UI" in log.read_text()
    finally:  # whatever is left of this test's processes, by their ids
        for pid in _marked(token):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
