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
        ("vllmmlxd.daemon", ["mlx", "mlx_lm", "vllmmlxd.engine.mlx_engine", "transformers"]),
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
