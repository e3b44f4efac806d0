"""The packages' layout holds: each subpackage of the engine and the supervisor's slot, and api,
gateway and supervisor, name in ``__all__`` exactly their modules that code outside them imports
(the rest are their own), and every module they name exists."""

from __future__ import annotations

import ast
import functools
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "vllmmlxd" / "engine"


def _imports(path: Path, package: str) -> set[str]:
    """The modules ``path`` imports, as dotted names (relative ones resolved from ``package``)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            target = ".".join(p for p in (base, node.module or "") if p)
            out.add(target)
            out.update(f"{target}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
    return out


def _modules(directory: Path) -> set[str]:
    return {p.stem for p in directory.glob("*.py") if p.stem != "__init__"}


@functools.cache
def _all_imports() -> tuple[tuple[str, frozenset[str]], ...]:
    """Every module of vllmmlxd, tests and bench, with what it imports (read once)."""
    out = []
    for root in ("vllmmlxd", "tests", "bench"):
        for path in (REPO / root).rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            importer = module if rel.name == "__init__" else module.rpartition(".")[0]
            out.append((module, frozenset(_imports(path, importer))))
    return tuple(out)


def used_from_outside(package: str) -> set[str]:
    """The modules of subpackage ``package`` (dotted) that code outside it imports (tests and bench too)."""
    folder = REPO / Path(*package.split("."))
    mine, prefix = _modules(folder), package.split(".")
    used: set[str] = set()
    for module, names in _all_imports():
        if module == package or module.startswith(package + "."):
            continue
        for name in names:
            parts = name.split(".")
            if parts[: len(prefix)] == prefix and len(parts) > len(prefix) and parts[len(prefix)] in mine:
                used.add(parts[len(prefix)])
    return used


SUBPACKAGES = [
    *(f"vllmmlxd.engine.{d.name}" for d in sorted(ENGINE.iterdir()) if (d / "__init__.py").exists()),
    "vllmmlxd.supervisor.slot",
]


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_each_subpackage_names_what_others_use_and_nothing_else(package):
    used = used_from_outside(package)
    surface = set(importlib.import_module(package).__all__)
    folder = REPO / Path(*package.split("."))
    assert surface <= _modules(folder), f"{package}.__all__ names modules that do not exist"
    assert used - surface == set(), f"{package}: used from outside but not in __all__"
    assert surface - used == set(), f"{package}: in __all__ but used only inside"


def test_the_scan_sees_the_subpackages():
    assert len(SUBPACKAGES) >= 10 and all(used_from_outside(p) for p in SUBPACKAGES)


def _used_from_outside_package(top: str) -> set[str]:
    """The modules (or subpackages) of ``vllmmlxd.<top>`` that other packages of vllmmlxd import."""
    used: set[str] = set()
    for path in (REPO / "vllmmlxd").rglob("*.py"):
        rel = path.relative_to(REPO).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        if module.startswith(f"vllmmlxd.{top}"):
            continue
        package = module if rel.name == "__init__" else module.rpartition(".")[0]
        for name in _imports(path, package):
            parts = name.split(".")
            if parts[:2] == ["vllmmlxd", top] and len(parts) > 2:
                here = REPO / "vllmmlxd" / top / parts[2]
                if here.with_suffix(".py").exists() or here.is_dir():
                    used.add(parts[2])
    return used


@pytest.mark.parametrize("top", ["api", "gateway", "supervisor"])
def test_api_gateway_and_supervisor_name_what_others_use(top):
    surface = set(importlib.import_module(f"vllmmlxd.{top}").__all__)
    assert surface == _used_from_outside_package(top)


def test_the_engine_package_names_its_face():
    engine = importlib.import_module("vllmmlxd.engine")
    assert set(engine.__all__) == {"mlx_engine", "options", "types"}
    assert all((ENGINE / f"{name}.py").exists() for name in engine.__all__)
