"""``pipelines/entry.py``: the ``weir`` command's entry point. Without the build extra (a training node's install:
one of its modules cannot be imported) it exits 2 with one line naming the missing module and
``pip install 'weir[build]'``; a missing module that is not a build dependency is a bug and is raised as it is;
with the extra it runs the CLI. Each case is a real interpreter in which a meta path finder refuses one module.
The command ends as Python would end it, less the interpreter's teardown: its status, its output flushed, the
threads that are no daemons waited for, the ``atexit`` handlers run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# python -c RUN REFUSED ARGS...: weir ARGS... in an interpreter in which the module REFUSED (and its submodules)
# cannot be imported, as if it were not installed
RUN = """\
import sys
refused = sys.argv[1]
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name == refused or name.startswith(refused + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
sys.argv = ["weir", *sys.argv[2:]]
from pipelines.entry import main
main()
"""


def weir_without(module: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RUN, module, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
    )


# the build extra's modules that `pipelines.cli` imports as it loads (others load with the commands that use them)
BUILD_MODULES = ["typer", "rich", "yaml"]


@pytest.mark.parametrize("module", BUILD_MODULES)
def test_without_the_build_extra_one_line_names_what_to_install(module: str) -> None:
    r = weir_without(module, "--help")
    assert r.returncode == 2 and r.stdout == "", (r.returncode, r.stdout)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert f"({module} is not installed)" in lines[0] and "pip install 'weir[build]'" in lines[0], lines[0]
    assert "Traceback" not in r.stderr


def test_a_missing_module_that_is_not_a_build_dependency_is_raised() -> None:
    r = weir_without("fsspec", "--help")  # a dependency of the loader itself: its absence is no missing extra
    assert r.returncode == 1
    assert "Traceback" in r.stderr and r.stderr.strip().endswith("ModuleNotFoundError: No module named 'fsspec'")
    assert "weir[build]" not in r.stderr


def test_with_the_extra_it_runs_the_cli(tiny_mix_path: Path) -> None:
    r = weir_without("no_such_module_weir_test", "validate", str(tiny_mix_path))
    assert r.returncode == 0, r.stderr
    assert f"{tiny_mix_path}: ok — mix 'tiny'" in r.stdout
    tiny_mix_path.write_text(tiny_mix_path.read_text().replace("notes: 0.75", "notes: .nan"))
    r = weir_without("no_such_module_weir_test", "validate", str(tiny_mix_path))
    assert r.returncode == 2 and "invalid mix file" in r.stderr, r.stderr  # the CLI's own exit, passed through


# python -c EXIT CASE: run_and_exit over a command per case, in a real interpreter, as the weir command ends
EXIT = """\
import atexit, sys, threading, time
from pathlib import Path
from pipelines.entry import run_and_exit
case, marks = sys.argv[1], Path(sys.argv[2])
atexit.register(lambda: (marks / "atexit").write_text("ran"))
class Kept:
    def __init__(self, mark):
        self.mark = mark
    def __del__(self):  # runs in the interpreter's teardown, which run_and_exit skips
        self.mark.write_text("ran")
kept = Kept(marks / "teardown")
if case == "profiled":  # as under python -m cProfile
    import cProfile
    cProfile.Profile().enable()
def late():
    time.sleep(0.3)
    (marks / "thread").write_text("done")
def command():
    threading.Thread(target=late).start()  # not a daemon: Python waits for it, so must run_and_exit
    print("x" * 100_000 if case == "long" else "said")  # a pipe's stdout is block-buffered: flushed at the end
    if case == "status":
        sys.exit(3)
    if case == "message":
        sys.exit("weir: the one line")
    if case == "raise":
        raise RuntimeError("a bug")
run_and_exit(command)
"""
# stdout block-buffered, as a pipe's is by default, so that what is flushed at the end is what is tested
BUFFERED = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


@pytest.mark.parametrize(
    ("case", "status", "out", "err"),
    [
        ("ok", 0, "said\n", ""),
        ("long", 0, "x" * 100_000 + "\n", ""),
        ("status", 3, "said\n", ""),
        ("message", 1, "said\n", "weir: the one line\n"),
        ("profiled", 0, "said\n", ""),
    ],
)
def test_the_command_ends_with_its_status_its_output_flushed_and_python_s_exit_work_done(
    tmp_path: Path, case: str, status: int, out: str, err: str
) -> None:
    r = subprocess.run(
        [sys.executable, "-c", EXIT, case, str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=BUFFERED
    )
    assert (r.returncode, r.stdout, r.stderr) == (status, out, err)
    assert (tmp_path / "atexit").read_text() == "ran"  # atexit handlers ran
    assert (tmp_path / "thread").read_text() == "done"  # a thread that is no daemon was waited for
    # the interpreter's teardown skipped, but under a profiler, which writes what it saw then
    assert (tmp_path / "teardown").exists() == (case == "profiled")


def test_an_exception_is_raised_as_python_raises_it(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-c", EXIT, "raise", str(tmp_path)], capture_output=True, text=True, cwd=ROOT, env=BUFFERED
    )
    assert r.returncode == 1 and r.stderr.strip().endswith("RuntimeError: a bug"), r.stderr
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"


def test_output_to_a_closed_pipe_exits_120_as_python_does(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # the reader is gone (weir inspect | head, head done) before the buffered line is flushed
    with os.fdopen(write, "wb") as stdout:
        argv = [sys.executable, "-c", EXIT, "ok", str(tmp_path)]
        r = subprocess.run(argv, stdout=stdout, stderr=subprocess.PIPE, cwd=ROOT, env=BUFFERED)
    assert r.returncode == 120, r.stderr
