"""No module changes another's private state or replaces another's methods at run time.

Read from the source: an assignment to ``x._name`` where ``x`` is not ``self`` or ``cls``, a
``setattr`` of a private name, or ``x.f = wrap(x.f)`` is allowed only in the one module over
mlx-lm's private parts (``engine/batch/mlxlm.py``) and in the pinned upstream fixes
(``engine/batch/upstream_fixes.py``: mlx-lm bugs, each with a test that tells when upstream fixed it).
A sharded model's layers are replaced by their shards (``engine/distributed/shard_llama.py``), as MLX's own
distributed sharding does: that module may wrap a layer, and nothing else.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "vllmmlxd"
ALLOWED = {"engine/batch/mlxlm.py", "engine/batch/upstream_fixes.py"}
WRAPS_LAYERS = {"engine/distributed/shard_llama.py"}


def writes(source: str) -> tuple[list[str], int]:
    """Each offending write in ``source`` (as text), and how many attribute writes were read."""
    found, seen = [], 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            flat = [t for target in targets for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
            for t in flat:
                if not isinstance(t, ast.Attribute):
                    continue
                seen += 1
                own = isinstance(t.value, ast.Name) and t.value.id in ("self", "cls")
                if t.attr.startswith("_") and not t.attr.startswith("__") and not own:
                    found.append(f"{ast.unparse(t)} = ...")
                elif _wraps(t, node.value) and not own:
                    found.append(f"{ast.unparse(t)} wrapped")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            seen += 1
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and str(name.value).startswith("_"):
                found.append(f"setattr(..., {name.value!r})")
    return found, seen


def _wraps(target: ast.Attribute, value: ast.expr | None) -> bool:
    """``x.f = g(x.f, ...)``: the attribute handed to a call whose result replaces it (an array
    op over an array, ``mx.*``, or ``max``/``min`` of a number, is data, not a wrap)."""
    if not isinstance(value, ast.Call) or not value.args:
        return False
    func = ast.unparse(value.func)
    data = func in ("max", "min") or func.startswith("mx.")
    return ast.unparse(value.args[0]) == ast.unparse(target) and not data


def test_no_module_writes_another_modules_private_state():
    offenders, seen = [], 0
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        found, n = writes(path.read_text())
        seen += n
        if rel in WRAPS_LAYERS:
            found = [f for f in found if not f.endswith(" wrapped")]
        if rel not in ALLOWED:
            offenders += [f"{rel}: {f}" for f in found]
    assert seen > 500, "the scan read too few writes: is it reading the package?"
    assert offenders == []


def test_the_scan_sees_each_kind_of_write():
    source = (
        "def f(scheduler, gen):\n"
        "    scheduler._step = None\n"
        "    gen.next = wrap(gen.next)\n"
        "    setattr(gen, '_prompt_batch', 1)\n"
        "    self_like = gen\n"
        "    self_like.public = 1\n"
    )
    assert writes(source)[0] == ["scheduler._step = ...", "gen.next wrapped", "setattr(..., '_prompt_batch')"]
