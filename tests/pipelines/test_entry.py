"""``pipelines/entry.py``: the ``weir`` command's entry point. Without the build extra (a training node's install:
one of its modules cannot be imported) it exits 2 with one line naming the missing module and
``pip install 'weir[build]'``; a missing module that is not a build dependency is a bug and is raised as it is;
with the extra it runs the CLI. Each case is a real interpreter in which a meta path finder refuses one module."""

from __future__ import annotations

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
