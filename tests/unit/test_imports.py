"""The dependency arrows of docs/architecture.md, checked."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "vllmmlxd"


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


# The packages from the bottom up: each may import from its own layer and those below, never above.
LAYERS = [
    {"errors", "log", "paths", "sockets", "__init__", "__main__"},  # stdlib only
    {"config", "runtime", "store"},  # store: stdlib, and huggingface_hub in its pull's own process
    {"parsers"},
    {"engine"},  # the only one that imports mlx
    {"http"},  # ASGI middleware, error shapes, serving
    {"mcp"},  # MCP clients
    {"api"},  # the API families over the engine's events
    {"worker", "gateway"},  # processes
    {"supervisor"},  # the daemon's side: never the engine
    {"control"},
    {"ctl"},
    {"daemon", "cli", "service_files"},  # composition roots
]
LAYER = {name: i for i, names in enumerate(LAYERS) for name in names}


def project_imports(path: Path, root: Path = PKG) -> set[str]:
    """The top-level packages of vllmmlxd that one module imports (absolute and relative)."""
    rel = path.relative_to(root).parts
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            base = list(rel[:-1])[: len(rel) - node.level] if node.level > 1 else list(rel[:-1])
            if node.module:
                targets = [".".join([*base, node.module])]
            else:  # `from .. import x`: a module of that package, or (at the top) the package's own __init__
                targets = [".".join([*base, a.name]) for a in node.names] if base else ["__init__"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllmmlxd."):
            targets = [node.module.removeprefix("vllmmlxd.")]
        elif isinstance(node, ast.Import):
            targets = [a.name.removeprefix("vllmmlxd.") for a in node.names if a.name.startswith("vllmmlxd.")]
        found.update(t.split(".")[0] for t in targets if t)
    return found


def upward_imports(pkg: Path) -> tuple[list[str], int]:
    offenders, checked = [], 0
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(pkg).parts
        own = rel[0] if len(rel) > 1 else rel[0].removesuffix(".py")
        for target in project_imports(path, pkg) - {own}:
            checked += 1
            if target not in LAYER or own not in LAYER:
                offenders.append(f"{'/'.join(rel)}: {own} -> {target} (not in LAYERS)")
            elif LAYER[target] > LAYER[own]:
                offenders.append(f"{'/'.join(rel)}: {own} imports {target}, a layer above it")
    return offenders, checked


def test_no_package_imports_a_package_above_it():
    offenders, checked = upward_imports(PKG)
    assert checked > 50, f"only {checked} imports between packages found: the check read nothing"
    assert offenders == []


def test_the_layer_check_finds_an_upward_import(tmp_path):
    (tmp_path / "http").mkdir()
    (tmp_path / "api").mkdir()
    (tmp_path / "http" / "browser.py").write_text("from ..api.errors import render_error\n")
    (tmp_path / "api" / "errors.py").write_text("from ..http import error_shapes\n")
    offenders, checked = upward_imports(tmp_path)
    assert checked == 2 and offenders == ["http/browser.py: http imports api, a layer above it"]


def test_only_the_engine_imports_mlx():
    offenders = [
        str(p.relative_to(PKG))
        for p in PKG.rglob("*.py")
        if "engine" not in p.relative_to(PKG).parts
        and any(m == "mlx" or m.startswith(("mlx.", "mlx_lm")) for m in imported_modules(p))
    ]
    assert offenders == []


@pytest.mark.parametrize(
    "module,forbidden",
    [
        # huggingface_hub runs in a pull's own process (store/fetch.py), never in the daemon.
        ("vllmmlxd.daemon", ["mlx", "mlx_lm", "vllmmlxd.engine.mlx_engine", "transformers", "huggingface_hub"]),
        ("vllmmlxd.supervisor.supervisor", ["mlx", "vllmmlxd.engine.loader"]),
        ("vllmmlxd.worker.app", ["mlx"]),
        ("vllmmlxd.gateway.main", ["mlx", "mlx_lm", "vllmmlxd.engine", "transformers"]),
        ("vllmmlxd.api.openai.routes", ["mlx"]),
        ("vllmmlxd.ctl.cli", ["mlx", "fastapi", "uvicorn", "starlette"]),
        ("vllmmlxd.config.load", ["mlx", "fastapi", "vllmmlxd.engine.types", "vllmmlxd.supervisor"]),
        # The supervisor answers plain data and control maps it: no cycle between the two.
        ("vllmmlxd.supervisor.supervisor", ["vllmmlxd.control", "fastapi"]),
        ("vllmmlxd.control.server", ["vllmmlxd.supervisor"]),
        ("vllmmlxd.supervisor.transitions", ["asyncio", "vllmmlxd.config", "pydantic"]),
    ],
)
def test_import_arrows(module, forbidden):
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert [m for m in forbidden if m in loaded] == []
