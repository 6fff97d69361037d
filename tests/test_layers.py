"""Imports flow pipelines → assets → {mixing, loaders}; mixing imports neither dagster nor torch; loaders
read mixing only through the build contract (``mixing.format``) and ``mixing.errors``."""

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
# What of mixing a loader may import: the build's format (manifest, shards, layout, index, ...) and the
# error base class. The plan, packing and ingest are mixing's own: a build is read through its files.
LOADERS_FROM_MIXING = ("mixing.errors", "mixing.format")


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def imported_names(path: Path) -> set[str]:
    """Every absolute import of ``path`` as a dotted name: ``import a.b`` → ``a.b``, ``from a.b import c`` →
    ``a.b.c`` (so ``from mixing import errors`` is ``mixing.errors``), function-level imports included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names |= {f"{node.module}.{a.name}" for a in node.names}
    return names


def beyond_the_contract(path: Path) -> set[str]:
    """The imports of ``path`` from mixing other than :data:`LOADERS_FROM_MIXING` and their modules."""
    return {
        n
        for n in imported_names(path)
        if n.split(".")[0] == "mixing" and not any(n == a or n.startswith(a + ".") for a in LOADERS_FROM_MIXING)
    }


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


def test_loaders_import_only_the_build_contract_of_mixing() -> None:
    bad = {
        str(p.relative_to(ROOT)): sorted(n) for p in (ROOT / "loaders").rglob("*.py") if (n := beyond_the_contract(p))
    }
    assert not bad, f"loaders import mixing beyond {LOADERS_FROM_MIXING}: {bad}"


def test_the_checker_sees_a_loader_reaching_past_the_contract(tmp_path: Path) -> None:
    p = tmp_path / "m.py"
    p.write_text(
        "import mixing.format\nfrom mixing.format.shards import ShardSet\nfrom mixing.errors import WeirError\n"
        "from mixing import errors, format\nfrom . import sibling\n"
        "def f():\n    from mixing.plan.mixture import WINDOW\n    import mixing.pack.packed\n"
        "    from mixing import load_mix\n    from mixing.formatting import x\n"
    )
    assert beyond_the_contract(p) == {
        "mixing.plan.mixture.WINDOW",
        "mixing.pack.packed",
        "mixing.load_mix",
        "mixing.formatting.x",
    }


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
