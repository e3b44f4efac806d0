"""The optional parts of vllmmlxd, each an extra of the package, and how to say one is missing. Stdlib only.

A plain ``pip install vllmmlxd`` serves every text feature; an entry that needs more names the
extra to install rather than failing on an import deep in a worker.
"""

from __future__ import annotations

from importlib.util import find_spec

# extra -> the module whose presence says it is installed
MODULES = {"vision": "mlx_vlm", "linux-fast": "mkl", "audio": "mlx_audio"}


def install_hint(extra: str) -> str:
    return f"pip install 'vllmmlxd[{extra}]'"


def installed(extra: str) -> bool:
    try:
        return find_spec(MODULES[extra]) is not None
    except (ImportError, ValueError):  # a broken parent package reads as missing
        return False


def missing_message(extra: str, what: str) -> str | None:
    """None when ``extra`` is installed; else what to tell the user who asked for ``what``."""
    if installed(extra):
        return None
    return f"{what} needs vllmmlxd's '{extra}' extra, which is not installed: {install_hint(extra)}"
