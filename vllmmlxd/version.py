"""What this vllmmlxd is: its version (``vllmmlxd.__version__``, the one place it is written; the
package's metadata reads it from there) and, run from a git clone, the commit it runs. Stdlib only."""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import __version__

ROOT = Path(__file__).resolve().parents[1]  # the clone's root, when the package runs from one


@functools.cache
def commit() -> str | None:
    """The clone's commit (short hash, ``+dirty`` with uncommitted changes), or None: an installed
    package, or no git at hand."""
    if not (ROOT / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, timeout=5
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def describe() -> str:
    """``0.1.0`` or ``0.1.0 (commit 1a2b3c4d5e6f)``: what ``--version`` prints."""
    found = commit()
    return f"{__version__} (commit {found})" if found else __version__


class VersionAction(argparse.Action):
    """``--version``: prints ``PROG VERSION (commit ...)`` and exits; the commit is only asked of git
    when the flag is given (building the parser, as every command does, runs nothing)."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any):
        super().__init__(option_strings, dest=dest, nargs=0, help="print the version (and the clone's commit) and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(f"{parser.prog} {describe()}", file=sys.stdout)
        parser.exit()
