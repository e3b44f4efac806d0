"""One writer per piece of state: a slot's or a unit's attributes are assigned only by its own actor
(``self`` in its class) or by the supervisor's task. Read from the source, so a new module that
reaches into a slot from outside fails here."""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[3] / "vllmmlxd"
SUPERVISOR = PKG / "supervisor"

# Functions that run in the supervisor's task (the only writer besides the actors), by module.
IN_THE_TASK = {
    "supervisor.py": None,  # every method of the Supervisor runs in its task or only posts to it
    "files.py": None,  # the supervisor's model files: called from its task only
    "reload.py": {"prepare", "start", "__init__"},
}
# What a slot's actor owns of the worker processes it starts (a WorkerProcess is the slot's).
WORKER_FIELDS = {"share", "ready_at", "failure", "config"}


def assignments(path: Path):
    """(function, target text, base name) of every attribute assignment whose base is not ``self``."""
    tree = ast.parse(path.read_text())
    found = []
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(func):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                else []
            )
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(t, ast.Attribute) and not (isinstance(t.value, ast.Name) and t.value.id == "self"):
                        found.append((func.name, ast.unparse(t), t.attr))
    return found


def test_nothing_outside_an_actor_or_the_task_assigns_a_slot_or_unit():
    offenders, seen = [], 0
    for path in PKG.rglob("*.py"):
        for func, target, attr in assignments(path):
            seen += 1
            rel = path.relative_to(PKG).as_posix()
            base = target.split(".")[0]
            if path.is_relative_to(SUPERVISOR):
                allowed = IN_THE_TASK.get(path.name, set())
                if allowed is None or func in allowed:
                    continue
                if path.name in ("slot.py", "slot_workers.py") and base in ("worker", "self") and attr in WORKER_FIELDS:
                    continue
            if any(word in target for word in ("slot", "unit", "checks", "supervisor")) or (
                path.is_relative_to(SUPERVISOR) and path.name not in ("process.py",)
            ):
                offenders.append(f"{rel}:{func}: {target}")
    assert seen > 0, "no assignment found: the check read nothing"
    assert offenders == []


def test_the_check_finds_an_assignment_from_outside(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def unload(slot):\n    slot.unloaded = True\n")
    assert assignments(bad) == [("unload", "slot.unloaded", "unloaded")]
