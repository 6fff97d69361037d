"""Imports flow pipelines → assets → {mixing, loaders} → contract: the factory (``mixing``) and the reader
(``loaders``) are peers that both depend on the build contract, which imports neither; ``mixing`` imports
neither dagster nor torch; ``loaders`` imports nothing a training node does not install (no dagster, ray,
duckdb, polars, pyarrow, numba, tokenizers, tiktoken or matplotlib)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LAYERS = ("assets", "pipelines")
# what the build extra installs and a training node does not: the loader and the contract import none of it
BUILD_ONLY = {"dagster", "ray", "duckdb", "polars", "pyarrow", "numba", "tokenizers", "tiktoken", "matplotlib"}
FORBIDDEN = {
    "contract": {"mixing", "loaders", "torch", *LAYERS, *BUILD_ONLY},
    "mixing": {"dagster", "torch", "loaders", *LAYERS},
    "loaders": {"mixing", *LAYERS, *BUILD_ONLY},
    "assets": {"pipelines"},
}
# opt-in accelerators a module may import inside a function, never when it is imported (the probe below checks)
OPT_IN = {"loaders/hybrid_kernels.py": {"numba"}}  # WEIR_HYBRID_ENGINE=compiled; the deal is numpy's by default


def imported_roots(path: Path) -> set[str]:
    """The top-level names ``path`` imports, function-level and ``TYPE_CHECKING`` imports included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package: str) -> None:
    found = {str(p.relative_to(ROOT)): imported_roots(p) & FORBIDDEN[package] for p in (ROOT / package).rglob("*.py")}
    bad = {
        f"{path}: {sorted(names - OPT_IN.get(path, set()))}"
        for path, names in found.items()
        if names - OPT_IN.get(path, set())
    }
    assert not bad, f"{package} imports a layer above it or a forbidden library: {sorted(bad)}"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text("import os\nfrom dagster import asset\ndef f():\n    from mixing.plan import mixture\n")
    assert imported_roots(p) == {"os", "dagster", "mixing"}


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        ("contract", {"mixing", "loaders", "torch", *LAYERS, *BUILD_ONLY}),
        ("mixing", {"dagster", "torch", "loaders"}),
        ("loaders", {"mixing", *LAYERS, *BUILD_ONLY}),
    ],
)
def test_importing_a_layer_does_not_load_forbidden_modules(module: str, absent: set[str]) -> None:
    """Every module of the layer imported in a fresh interpreter: what is loaded then, not just what is written."""
    code = (
        f"import sys, {module}, pkgutil, importlib\n"
        f"for m in pkgutil.walk_packages({module}.__path__, '{module}.'): importlib.import_module(m.name)\n"
        "print(' '.join(sorted(m for m in sys.modules if '.' not in m)))"
    )
    loaded = set(
        subprocess.run(
            [sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
        ).stdout.split()
    )
    assert loaded, "the probe printed no modules"
    assert not loaded & absent, f"importing {module} loaded {sorted(loaded & absent)}"
