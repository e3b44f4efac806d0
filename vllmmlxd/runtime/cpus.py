"""CPU shares: which cores each worker runs on, so workers on one machine do not fight over them.

``plan_shares`` is pure: the daemon calls it over all its model entries and passes each
worker its share (``--cpus``). Pinning and reading the machine's cores are the thin shell.
Linux only: macOS has no CPU affinity API, and its workers run on Metal anyway.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CpuShare:
    """The cores one worker is pinned to; its BLAS runs ``threads`` threads on them."""

    cpus: tuple[int, ...]
    threads: int
    oversubscribed: bool = False  # some of these cores are also another worker's

    def render(self) -> str:
        return format_cpus(self.cpus)


def plan_shares(requests: Mapping[str, int | None], cpus: Sequence[int]) -> dict[str, CpuShare]:
    """Split ``cpus`` between entries, in the order given.

    An entry asking for ``threads`` gets that many cores and threads; the others split what is
    left evenly (earlier entries get the remainder), at least one core each, and run one thread
    fewer than their cores (:func:`default_threads`). When the asks add up to more cores than
    there are, shares wrap around and are marked ``oversubscribed``.
    """
    cpus = tuple(sorted(set(cpus)))
    if not requests or not cpus:
        return {}
    fixed = sum(n for n in requests.values() if n)
    auto = [name for name, n in requests.items() if not n]
    left = max(len(cpus) - fixed, 0)
    sizes: dict[str, int] = {}
    for i, name in enumerate(auto):
        even, extra = divmod(left, len(auto))
        sizes[name] = max(1, even + (1 if i < extra else 0))
    total = fixed + sum(sizes.values())
    plan: dict[str, CpuShare] = {}
    start = 0
    for name, asked in requests.items():
        size = min(asked or sizes[name], len(cpus))
        share = tuple(sorted({cpus[(start + k) % len(cpus)] for k in range(size)}))
        plan[name] = CpuShare(share, asked or default_threads(size), oversubscribed=total > len(cpus))
        start += size
    return plan


def default_threads(cores: int) -> int:
    """BLAS threads for a worker on ``cores`` cores when none are asked for: one fewer, at least one.

    The worker's own threads (the engine loop, HTTP, detokenizing) need a core too; a BLAS thread
    that shares it is descheduled mid-product while its peers wait. On 2 cores, beside busy
    processes, one thread decoded 16-49% faster than two; quiet, two were up to a third faster
    (docs/benchmarks.md, "Noisy neighbours"): the default holds up when the machine is shared.
    """
    return max(1, cores - 1)


def format_cpus(cpus: Iterable[int]) -> str:
    """``0-3,6``: the list form of taskset and cgroups."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def parse_cpus(text: str) -> tuple[int, ...]:
    """The inverse of :func:`format_cpus`; ValueError on anything else."""
    ids: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        first, last = int(lo), int(hi or lo)
        if first < 0 or last < first:
            raise ValueError(f"bad CPU range {part!r}")
        ids.update(range(first, last + 1))
    if not ids:
        raise ValueError("no CPUs given")
    return tuple(sorted(ids))


def can_pin() -> bool:
    """True where a process can be pinned to cores (Linux)."""
    return hasattr(os, "sched_setaffinity") and sys.platform.startswith("linux")


def available_cpus() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask, which honours cgroup cpusets)."""
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def pin(cpus: Sequence[int]) -> None:
    """Pin this process to ``cpus``; threads started afterwards inherit it. Call it first thing."""
    if can_pin():
        os.sched_setaffinity(0, set(cpus))
