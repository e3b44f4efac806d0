"""The dependency arrows of docs/architecture.md, checked."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "vllmmlxd"


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


REPO = PKG.parent


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    """``make lint``'s import contract (pyproject.toml's [tool.importlinter]) over the package found in ``root``."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "lint-imports"), "--no-cache", "--config", str(REPO / "pyproject.toml")],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_import_contract_holds_and_reads_the_whole_package():
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout[-3000:]
    files, dependencies = map(int, re.search(r"Analyzed (\d+) files, (\d+) dependencies", result.stdout).groups())
    assert files > 200 and dependencies > 500, "the contract read almost nothing"


@pytest.mark.parametrize(
    "module,line,broken",
    [
        # An upward import, even inside a function: http is below api.
        ("http/serving.py", "def _up():\n    from vllmmlxd.api import errors\n", "Layers"),
        # A cycle between two modules of one package.
        ("engine/text/stops.py", "from vllmmlxd.engine.text import detokenize\n", "No cycle"),
        # A cycle between two subpackages of the engine: the step loop reads the cache, not the reverse.
        ("engine/cache/kv.py", "from vllmmlxd.engine.step import scheduler\n", "No cycle"),
        # A cycle between two packages of one layer: runtime is imported by config.
        ("runtime/cpus.py", "from vllmmlxd.config import names\n", "No cycle"),
    ],
)
def test_the_import_contract_fails_on_an_upward_import_or_a_cycle(tmp_path, module, line, broken):
    copy = tmp_path / "vllmmlxd"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    if broken == "No cycle" and module == "engine/text/stops.py":
        detokenize = copy / "engine" / "text" / "detokenize.py"
        detokenize.write_text("from vllmmlxd.engine.text import stops\n" + detokenize.read_text())
    (copy / module).write_text((copy / module).read_text() + "\n" + line)
    result = lint_imports(tmp_path)
    assert result.returncode != 0 and f"{broken}" in result.stdout.split("Broken contracts", 1)[-1], result.stdout[
        -3000:
    ]


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
        ("vllmmlxd.supervisor.supervisor", ["mlx", "vllmmlxd.engine.loading.loader"]),
        ("vllmmlxd.worker.app", ["mlx"]),
        ("vllmmlxd.gateway.main", ["mlx", "mlx_lm", "vllmmlxd.engine", "transformers"]),
        ("vllmmlxd.api.openai.routes", ["mlx"]),
        ("vllmmlxd.ctl.cli", ["mlx", "fastapi", "uvicorn", "starlette"]),
        ("vllmmlxd.config.load", ["mlx", "fastapi", "vllmmlxd.engine.types", "vllmmlxd.supervisor"]),
        # The supervisor answers plain data and control maps it: no cycle between the two.
        ("vllmmlxd.supervisor.supervisor", ["vllmmlxd.control", "fastapi"]),
        ("vllmmlxd.control.server", ["vllmmlxd.supervisor"]),
        ("vllmmlxd.supervisor.slot.transitions", ["asyncio", "vllmmlxd.config", "pydantic"]),
        # How an engine schedules is plain data, read without loading the engine.
        ("vllmmlxd.engine.options", ["mlx", "mlx_lm", "numpy"]),
    ],
)
def test_import_arrows(module, forbidden):
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    loaded = set(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    )
    assert [m for m in forbidden if m in loaded] == []
