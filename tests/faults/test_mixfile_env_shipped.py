"""``{env_NAME}`` in a source path, read in a fresh process that lacks the variable (a Ray worker's environment is
its cluster's): with the values the lister shipped (:func:`mixing.mixfile.envvars.shipped`) it opens the files
the index lists, and its messages hide the shipped value; without them it cannot. A credential's name is never
shipped. (The same on a real two-node Ray cluster: tests/pipelines/test_ray_build.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mixing.mixfile import envvars

ROOT = Path(__file__).resolve().parents[2]
VAR, SHOWN = "WEIR_TEST_SHIPPED_ROOT", "{env_WEIR_TEST_SHIPPED_ROOT}"
READ = """
import json, sys
from mixing.ingest.sources import read_records
from mixing.mixfile.mix import SourceSpec
env = json.loads(sys.argv[2])
recs = read_records(sys.argv[1], SourceSpec(uri="unused", format="jsonl"), None, env or None)
print(json.dumps([[r.text, r.reason, r.error] for r in recs]))
"""


def _read_elsewhere(path: str, env: dict[str, str]) -> list[list[str | None]]:
    """``read_records(path, ..., env)`` in a fresh interpreter whose environment lacks :data:`VAR`."""
    clean = {k: v for k, v in os.environ.items() if k != VAR}
    out = subprocess.run(
        [sys.executable, "-c", READ, path, json.dumps(env)], env=clean, cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def test_a_process_without_the_variable_reads_with_the_shipped_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "hello"}\n')
    monkeypatch.setenv(VAR, str(tmp_path))
    monkeypatch.setenv("WEIR_TEST_SECRET_TOKEN", "t0k3n")
    shown = f"{SHOWN}/a.jsonl"
    env = envvars.shipped([shown, "{env_WEIR_TEST_SECRET_TOKEN}/x", "{env_WEIR_TEST_UNSET_ROOT}/y"])
    assert env == {VAR: str(tmp_path)}, "only set variables that may be expanded are shipped"
    assert _read_elsewhere(shown, env) == [["hello", None, None]]
    (unread,) = _read_elsewhere(shown, {})  # the fault a worker without them had: the placeholder taken literally
    assert unread[1] == "unreadable file" and SHOWN in str(unread[2])
    (missing,) = _read_elsewhere(f"{SHOWN}/gone.jsonl", env)  # its message hides the shipped value
    assert missing[1] == "unreadable file" and f"{SHOWN}/gone.jsonl" in str(missing[2])
    assert str(tmp_path) not in str(missing[2])
