"""The packages' layout holds: each engine subpackage's ``__init__``, and api's, gateway's and supervisor's, name
in ``__all__`` exactly the modules that other packages import (the rest are their own), and every
module they name exists."""

from __future__ import annotations

import ast
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


def used_from_outside() -> dict[str, set[str]]:
    """For each engine subpackage, its modules that code outside it imports (tests and bench too)."""
    subpackages = {d.name for d in ENGINE.iterdir() if (d / "__init__.py").exists()}
    used: dict[str, set[str]] = {sub: set() for sub in subpackages}
    for root in ("vllmmlxd", "tests", "bench"):
        for path in (REPO / root).rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
            package = module if rel.name == "__init__" else module.rpartition(".")[0]
            for name in _imports(path, package):
                parts = name.split(".")
                if parts[:2] != ["vllmmlxd", "engine"] or len(parts) < 4 or parts[2] not in subpackages:
                    continue
                if module.startswith(f"vllmmlxd.engine.{parts[2]}") or parts[3] not in _modules(ENGINE / parts[2]):
                    continue
                if root == "tests" and path.parent.name == parts[2]:
                    continue
                used[parts[2]].add(parts[3])
    return used


def test_each_subpackage_names_what_others_use_and_nothing_else():
    used = used_from_outside()
    assert len(used) >= 8, "the scan found too few subpackages"
    for sub, modules in used.items():
        surface = set(importlib.import_module(f"vllmmlxd.engine.{sub}").__all__)
        assert surface <= _modules(ENGINE / sub), f"engine.{sub}.__all__ names modules that do not exist"
        assert modules - surface == set(), f"engine.{sub}: used from outside but not in __all__"
        assert surface - modules == set(), f"engine.{sub}: in __all__ but used only inside"


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
