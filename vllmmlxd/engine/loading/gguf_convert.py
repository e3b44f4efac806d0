"""GGUF conversion in a throwaway child process.

MLX's GGUF reader is C code with open out-of-bounds reports: a corrupt or hostile file
could crash, hang or scribble on the memory of whatever process parses it. The worker
never parses one itself; it runs ``python -m vllmmlxd.engine.loading.gguf_child SRC DEST``
with a timeout and turns any death of the child into a ``ModelLoadError`` naming the file.

The child's contract: exit 0 with DEST filled; or exit ``EXIT_REFUSED`` after writing one
``ERROR_PREFIX`` line (a ``ModelLoadError``: unsupported architecture, unreadable file)
to stderr; anything else (a traceback, a signal, the timeout) is a crash.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from vllmmlxd.errors import ModelLoadError

EXIT_REFUSED = 3
ERROR_PREFIX = "vllmmlxd-gguf-error: "
TIMEOUT_S = 3600.0  # dequantizing a 70B Q4 file to float16 takes minutes, not an hour
_TAIL_LINES = 5


def convert_command(gguf_path: Path, folder: Path) -> list[str]:
    """The child's argv: this interpreter, this module (as the worker itself is started)."""
    return [sys.executable, "-m", "vllmmlxd.engine.loading.gguf_child", str(gguf_path), str(folder)]


def convert_in_child(gguf_path: Path, folder: Path, timeout: float | None = None) -> None:
    """Convert ``gguf_path`` into ``folder`` in a child process; ModelLoadError if it fails in any way.

    ``folder`` is left as the child left it: the caller (``gguf.build_once``) removes it on error.
    """
    timeout = TIMEOUT_S if timeout is None else timeout
    try:
        proc = subprocess.run(
            convert_command(gguf_path, folder),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:  # run() has killed the child by now
        raise ModelLoadError(
            f"converting GGUF file {gguf_path} took longer than {timeout:g} s; the converter was killed"
        ) from None
    if proc.returncode == 0:
        return
    lines = proc.stderr.strip().splitlines()
    refused = [line[len(ERROR_PREFIX) :] for line in lines if line.startswith(ERROR_PREFIX)]
    if proc.returncode == EXIT_REFUSED and refused:
        raise ModelLoadError(refused[-1])
    raise ModelLoadError(
        f"converting GGUF file {gguf_path} failed: the converter {describe_exit(proc.returncode)}; the file may be "
        f"corrupt, truncated or not a model. It said: {' | '.join(lines[-_TAIL_LINES:]) or '(nothing)'}"
    )


def describe_exit(returncode: int) -> str:
    """``exited with status 1`` or ``was killed by signal 11 (SIGSEGV)``."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "unknown"
    return f"was killed by signal {-returncode} ({name})"
