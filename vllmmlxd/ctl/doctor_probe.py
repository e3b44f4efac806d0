"""What ``vllmmlxctl doctor`` reads of the machine: thin shells around the OS, each returning plain
values for doctor_checks.py to judge. None of them imports mlx: the engine runs in a child."""

from __future__ import annotations

import errno
import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DISTRIBUTIONS = ("mlx", "mlx-metal", "mlx-cpu", "mlx-cuda", "mlx-lm", "mlx-vlm", "mlx-audio")
TOOL_TIMEOUT_S = 5.0


def versions() -> dict[str, str | None]:
    """The installed version of each distribution vllmmlxd runs on (package metadata only: nothing imported)."""
    out: dict[str, str | None] = {}
    for name in DISTRIBUTIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def run_tool(argv: list[str]) -> tuple[int | None, str]:
    """A system tool's exit code and output; (None, "") when the tool is absent or hangs."""
    if shutil.which(argv[0]) is None:
        return None, ""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return None, ""
    return done.returncode, done.stdout


def wired_limit_mb() -> int | None:
    """``sysctl iogpu.wired_limit_mb`` (macOS 14+; 0: the default), None where it cannot say."""
    rc, out = run_tool(["sysctl", "-n", "iogpu.wired_limit_mb"])
    return int(out.strip()) if rc == 0 and out.strip().isdigit() else None


def blas_candidates() -> list[str]:
    """The optimised BLAS libraries a worker on this Linux would try (found, not loaded)."""
    from vllmmlxd.runtime.blas_find import candidates

    found, _ = candidates("auto")
    return [f"{c.name} ({c.path})" for c in found]


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def state_dir_facts(path: Path) -> tuple[bool, bool, int | None]:
    """Whether ``path`` exists, whether this user may write it, and the free bytes of its disk
    (of its nearest existing parent when it does not exist yet)."""
    exists = path.is_dir()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        free = None
    return exists, os.access(path if exists else probe, os.W_OK), free


def service_answers(platform: str, unit: str, label: str) -> tuple[str | None, dict[str, tuple[int | None, str]]]:
    """The service manager here and its raw answer per scope; (None, {}) when there is none."""
    if platform == "darwin":
        uid = os.getuid()
        targets = {
            "user": f"gui/{uid}/{label}",
            "system": f"system/{label}",
            "homebrew": f"gui/{uid}/homebrew.mxcl.vllmmlxd",
        }
        if shutil.which("launchctl") is None:
            return None, {}
        return "launchctl", {scope: run_tool(["launchctl", "print", t]) for scope, t in targets.items()}
    if shutil.which("systemctl") is None:
        return None, {}
    show = ["show", "-p", "LoadState,ActiveState", unit]
    return "systemctl", {
        "user": run_tool(["systemctl", "--user", *show]),
        "system": run_tool(["systemctl", *show]),
    }


def bind_error(host: str, port: int) -> str | None:
    """None when ``host:port`` could be listened on now; else why not (``in use`` when held)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the daemon binds: TIME_WAIT is not "held"
        try:
            s.bind((host, port))
            s.listen(1)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return "in use"
            return exc.strerror or str(exc)
    return None


def run_selftest(
    model: str, state_dir: Path, blas: str, timeout_s: float, paths: str | None = None
) -> tuple[dict[str, Any] | None, str | None, float]:
    """The engine self-test in a child interpreter: its JSON answer, or why there is none; and its time."""
    argv = [sys.executable, "-m", "vllmmlxd.engine.selftest", "--model", model, "--state-dir", str(state_dir)]
    argv += ["--blas", blas] + (["--paths", paths] if paths else [])
    started = time.monotonic()
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, f"the self-test took more than {timeout_s:.0f} s", time.monotonic() - started
    seconds = time.monotonic() - started
    lines = done.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]), None, seconds
    except (IndexError, json.JSONDecodeError):
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return None, f"the self-test's process exited {done.returncode} without a report: {tail}", seconds
