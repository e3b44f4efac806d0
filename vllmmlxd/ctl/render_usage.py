"""``vllmmlxctl usage``: each key's use per model, and its budgets, as a table. Pure functions."""

from __future__ import annotations

import argparse
import re

from vllmmlxd.control.protocol import BudgetStatus, UsageResponse
from vllmmlxd.ctl.formats import format_duration, render_table

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def period(text: str) -> float:
    """``30m``, ``1h``, ``1d``, ``7d`` (or seconds) as seconds: argparse's type for ``--since``."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text)
    if not found or float(found.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a period: say 30m, 1h, 1d or 7d")
    return float(found.group(1)) * UNITS[found.group(2) or "s"]


def render_usage(report: UsageResponse) -> str:
    rows = [
        [
            r.key or "(no key)",
            r.model,
            f"{r.requests:,}",
            f"{r.errors:,}",
            f"{r.input_tokens:,} ({r.cached_tokens:,})",
            f"{r.output_tokens:,}",
        ]
        for r in report.rows
    ]
    head = f"use over the last {format_duration(report.since_s)}"
    table = render_table(["KEY", "MODEL", "REQUESTS", "ERRORS", "IN (CACHED)", "OUT"], rows) if rows else "(none)"
    lines = [head, table]
    if report.budgets:
        lines += ["", "budgets:"] + [f"  {budget_line(b)}" for b in report.budgets]
    return "\n".join(lines)


def budget_line(b: BudgetStatus) -> str:
    parts = []
    if b.tokens_per_day:
        parts.append(f"{b.day_tokens:,} of {b.tokens_per_day:,} tokens today ({b.left['tokens_per_day']:,} left)")
    if b.requests_per_day:
        parts.append(
            f"{b.day_requests:,} of {b.requests_per_day:,} requests today ({b.left['requests_per_day']:,} left)"
        )
    if b.tokens_per_month:
        parts.append(
            f"{b.month_tokens:,} of {b.tokens_per_month:,} tokens this month ({b.left['tokens_per_month']:,} left, "
            f"resets {b.month_resets})"
        )
    daily = f"; the day resets {b.day_resets}" if b.tokens_per_day or b.requests_per_day else ""
    return f"{b.key}: " + "; ".join(parts) + daily
