"""How much memory this machine has. Stdlib only.

The daemon plans with it (``supervisor.memory``) and a worker sizes its prefix cache by it;
what a model's weights take is read from its files in :mod:`.weights`.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

MIB = 1 << 20


# -- the machine ---------------------------------------------------------------


@dataclass(frozen=True)
class MachineMemory:
    """Physical memory in bytes (None: unknown), what it was read from, and MLX's GPU working set (macOS)."""

    physical: int | None
    source: str
    working_set: int | None = None


def read_machine_memory(*, working_set: bool = True) -> MachineMemory:
    """Linux: MemTotal, lowered by a cgroup v2 ``memory.max``; macOS: ``hw.memsize`` and MLX's working set.

    ``working_set=False`` skips asking MLX (a child process, about a second) where only the physical size matters.
    """
    if sys.platform == "darwin":
        return MachineMemory(_sysctl_memsize(), "hw.memsize", metal_working_set() if working_set else None)
    total, limit = meminfo_total(), cgroup_memory_limit()
    if limit is not None and (total is None or limit < total):
        return MachineMemory(limit, "cgroup memory.max")
    return MachineMemory(total, "MemTotal" if total is not None else "unknown")


def meminfo_total(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """MemTotal in bytes, or None where there is no /proc."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def cgroup_memory_limit(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The lowest numeric ``memory.max`` of this process's cgroup v2 and its parents (None: no limit)."""
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None
    limits = []
    folder = root / path.strip("/")
    # A limit set on a parent (a systemd slice) binds its children too.
    while True:
        try:
            text = (folder / "memory.max").read_text().strip()
            if text.isdigit():
                limits.append(int(text))
        except OSError:
            pass
        if folder == root or root not in folder.parents:
            break
        folder = folder.parent
    return min(limits) if limits else None


def _sysctl_memsize() -> int | None:
    try:
        return int(subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True, text=True, timeout=10).stdout)
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


@functools.cache
def metal_working_set() -> int | None:
    """MLX's recommended GPU working set in bytes, asked of a child process (the daemon never imports mlx)."""
    code = (
        "import mlx.core as mx; info = getattr(mx, 'device_info', None) or mx.metal.device_info; "
        "print(info()['max_recommended_working_set_size'])"
    )
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
        return int(out.split()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def cpu_backend() -> bool:
    """True where MLX runs on the CPU (Linux), which loads half-precision weights as float32."""
    return sys.platform != "darwin"
