"""Choose the BLAS library MLX's CPU backend multiplies float32 matrices with, before mlx loads.

On Linux the ``mlx-cpu`` wheel links a bundled reference BLAS: correct but 10-30x slower
than an optimised one. Every float32 matrix product reaches ``cblas_sgemm``, so loading a
real library into the process's global symbol scope *before* mlx is imported makes MLX
call it instead (the dynamic linker searches the global scope before a library's own
dependencies). That is ``LD_PRELOAD`` without re-executing the process, without leaking
into child processes, and with a way back: a library that fails its self-check
(:mod:`.blas_probe`, in a child process) is simply never loaded. Once mlx is up,
``engine/loading/blas_check.py`` confirms that MLX really calls it. On macOS nothing is loaded: MLX
uses Metal and Accelerate there.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .blas_find import Candidate, candidates, find_bundled, thread_env
from .blas_probe import ProbeResult, probe

# `auto` takes the fastest library at a decode-shaped product, unless the first in
# AUTO_ORDER is within this margin of it: a near tie should not flip between restarts.
TIE_MARGIN = 0.10


@dataclass(frozen=True)
class BlasInfo:
    """What a worker runs with: shown in its log, /v1/status and ``vllmmlxctl status``."""

    name: str  # mkl | blis | openblas | bundled | accelerate | the file name of a custom library
    path: str | None
    threads: int
    requested: str
    warning: str | None = None  # why the request was not met, when it fell back
    env: dict[str, str] = field(default_factory=dict)  # the threading variables it was given
    timings: dict[str, float] = field(default_factory=dict)  # ms of the probe's product, per library tried

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ActiveBlas:
    """The library MLX now calls (None: the bundled one).

    ``sums_differ``: its products carry a fingerprint unlike the reference BLAS, which lets
    the engine confirm that MLX really calls it.
    """

    info: BlasInfo
    lib: ctypes.CDLL | None = None
    sums_differ: bool = False


def pick(passed: list[tuple[Candidate, ProbeResult]]) -> tuple[Candidate, ProbeResult]:
    """The fastest library at the decode-shaped product; the earliest wins a near tie."""
    first = passed[0]
    fastest = min(passed, key=lambda item: item[1].gemv_ms or float("inf"))
    if first[1].gemv_ms is None or fastest[1].gemv_ms is None:
        return first
    return first if first[1].gemv_ms <= fastest[1].gemv_ms * (1 + TIE_MARGIN) else fastest


def activate(choice: str, threads: int, *, platform: str = sys.platform, memo_dir: Path | None = None) -> ActiveBlas:
    """Make MLX's CPU backend use the library ``choice`` names, or fall back to the bundled one.

    Must run before mlx is imported. Never raises for a bad library: the reason comes back
    as ``info.warning``. ``memo_dir`` remembers the libraries' self-checks between starts.
    """
    if not platform.startswith("linux"):
        warning = (
            None if choice in ("auto", "bundled") else f"blas: {choice} applies on Linux only; MLX uses Accelerate here"
        )
        return ActiveBlas(BlasInfo("accelerate", None, threads, choice, warning))
    bundled = BlasInfo("bundled", find_bundled(), 1, choice)
    if choice == "bundled":
        return ActiveBlas(bundled)
    if "mlx.core" in sys.modules:
        return ActiveBlas(_fallback(bundled, "mlx was imported before the BLAS was chosen"))
    found, why = candidates(choice)
    reasons = [why] if why else []
    passed: list[tuple[Candidate, ProbeResult]] = []
    for cand in found:
        result = probe(str(cand.path), thread_env(cand.name, threads, cand.path), memo_dir)
        if result.error:
            reasons.append(f"{cand.name} ({cand.path}): {result.error}")
        else:
            passed.append((cand, result))
    if not passed:
        return ActiveBlas(_fallback(bundled, "; ".join(reasons) or "no library to try"))
    cand, result = pick(passed)
    env = thread_env(cand.name, threads, cand.path)
    os.environ.update(env)  # read by the library as it loads
    lib = ctypes.CDLL(str(cand.path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    timings = {c.name: r.gemv_ms for c, r in passed if r.gemv_ms is not None}
    info = BlasInfo(cand.name, str(cand.path.resolve()), threads, choice, "; ".join(reasons) or None, env, timings)
    return ActiveBlas(info, lib, result.sums_differ)


def _fallback(bundled: BlasInfo, reason: str) -> BlasInfo:
    return BlasInfo(bundled.name, bundled.path, 1, bundled.requested, reason)
