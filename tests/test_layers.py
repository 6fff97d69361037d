"""Imports flow pipelines → assets → {mixing, loaders}; mixing imports neither dagster nor torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "mixing": {"dagster", "torch", "loaders", "assets", "pipelines"},
    "loaders": {"dagster", "assets", "pipelines"},
    "assets": {"pipelines"},
}


def imported_roots(path: Path) -> set[str]:
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
    bad = {
        f"{p.relative_to(ROOT)}: {sorted(imported_roots(p) & FORBIDDEN[package])}"
        for p in (ROOT / package).rglob("*.py")
        if imported_roots(p) & FORBIDDEN[package]
    }
    assert not bad, f"{package} imports a layer above it or a forbidden library: {sorted(bad)}"


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text("import os\nfrom dagster import asset\n")
    assert "dagster" in imported_roots(p)


@pytest.mark.parametrize(("module", "absent"), [("mixing", {"dagster", "torch"}), ("loaders", {"dagster"})])
def test_importing_a_layer_does_not_load_forbidden_modules(module: str, absent: set[str]) -> None:
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
    assert not loaded & absent, f"importing {module} loaded {sorted(loaded & absent)}"
