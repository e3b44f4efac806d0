"""``vllmmlxctl doctor``'s report: one line per check for people, the same as data for ``--json``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllmmlxd.ctl.doctor_checks import Check, failed

TITLES = {
    "versions": "versions",
    "device": "device",
    "state": "state",
    "config": "config",
    "service": "service",
    "ports": "ports",
    "engine": "engine self-test (each path against mlx-lm's own greedy generation)",
}
MARKS = {"ok": "ok", "warn": "warn", "fail": "FAIL", "skip": "--"}


def render_text(header: str, checks: Sequence[Check]) -> str:
    """The readable report: a title per part, one line per check (level, name, why, time), and
    the verdict naming what failed."""
    lines = [header]
    part = None
    width = max((len(c.name) for c in checks), default=8)
    for c in checks:
        if c.part != part:
            part = c.part
            lines.append(TITLES.get(part, part))
        took = f" ({c.seconds:.2f} s)" if c.seconds is not None else ""
        lines.append(f"  {MARKS.get(c.level, c.level):<4}  {c.name:<{width}}  {c.detail}{took}")
    lines.append(verdict(checks))
    return "\n".join(lines)


def verdict(checks: Sequence[Check]) -> str:
    bad = failed(checks)
    if bad:
        return f"FAILED: {', '.join(bad)}"
    warnings = sum(1 for c in checks if c.level == "warn")
    return "all checks passed" + (f" ({warnings} warning{'s' if warnings != 1 else ''})" if warnings else "")


def to_json(header: str, checks: Sequence[Check], selftest: dict[str, Any] | None) -> dict[str, Any]:
    """``--json``: every check as data, what failed, and the self-test's own report."""
    bad = failed(checks)
    return {
        "ok": not bad,
        "failed": bad,
        "summary": verdict(checks),
        "header": header,
        "checks": [c.as_dict() for c in checks],
        "selftest": selftest,
    }
