"""transformers' lazy-import table, kept on disk from one worker start to the next.

``import transformers`` (5.x) builds the table its lazy modules import from by reading every
one of its ~3,300 model source files: 1.2 s of CPU at each worker start on a 2-core x86 box,
a quarter of the start. The table depends only on the installed files, so the first worker
writes it to the user's cache directory, keyed by the transformers install, and later starts
read it back. JSON, not pickle: a cache file never runs code. Anything unexpected (another
transformers layout, an unreadable file) falls back to transformers' own function.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from ..paths import default_cache_dir

TARGET = "transformers.utils.import_utils"
FUNCTION = "define_import_structure"

Table = dict[frozenset[str], dict[str, set[str]]]


def install(cache_dir: Path | None = None) -> bool:
    """Memoize the table for this process; False when transformers is absent or already imported."""
    if TARGET in sys.modules or "transformers" in sys.modules:
        return False
    spec = importlib.util.find_spec("transformers")  # finds the package without running it
    if spec is None or spec.origin is None:
        return False
    memo_path = (
        cache_dir or default_cache_dir()
    ) / f"transformers-imports-{install_key(Path(spec.origin).parent)}.json"
    sys.meta_path.insert(0, _Finder(memo_path))
    return True


def install_key(package_dir: Path) -> str:
    """Changes whenever the installed transformers does: its place and its files' times."""
    parts = [str(package_dir)]
    for sub in ("__init__.py", "models", "utils/import_utils.py"):
        info = (package_dir / sub).stat()
        parts.append(f"{sub}:{info.st_mtime_ns}:{info.st_size}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def encode(table: Table) -> list:
    return [
        [sorted(backends), {module: sorted(names) for module, names in modules.items()}]
        for backends, modules in table.items()
    ]


def decode(data: list) -> Table:
    return {
        frozenset(backends): {module: set(names) for module, names in modules.items()} for backends, modules in data
    }


def memoized(real: Callable[..., Table], memo_path: Path) -> Callable[..., Table]:
    """``real`` with its results kept in ``memo_path``: every call returns fresh objects (callers mutate them)."""
    try:
        memo: dict[str, list] = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}

    def define_import_structure(module_path: Any, prefix: str | None = None) -> Table:
        key = f"{module_path}|{prefix}"
        if key in memo:
            try:
                return decode(memo[key])
            except (TypeError, ValueError):
                pass
        table = real(module_path, prefix)
        memo[key] = encode(table)
        _write(memo_path, memo)
        return table

    return define_import_structure


def _write(path: Path, memo: dict) -> None:
    # Written whole then renamed: two workers starting at once never read half a file.
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".imports-")
        with os.fdopen(fd, "w") as f:
            json.dump(memo, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: every start builds the table, as without the memo


class _Finder(importlib.abc.MetaPathFinder):
    """Loads transformers' import utilities as usual, then swaps in the memoized function."""

    def __init__(self, memo_path: Path):
        self.memo_path = memo_path

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module
        memo_path = self.memo_path

        def exec_module(module: ModuleType) -> None:
            run(module)
            real = getattr(module, FUNCTION, None)
            if callable(real):
                setattr(module, FUNCTION, memoized(real, memo_path))

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec
