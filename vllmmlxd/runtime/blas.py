"""Choose the BLAS library MLX's CPU backend multiplies float32 matrices with, before mlx loads.

On Linux the ``mlx-cpu`` wheel links a bundled reference BLAS: correct but 10-30x slower
than an optimised one. Every float32 matrix product reaches ``cblas_sgemm``, so loading a
real library into the process's global symbol scope *before* mlx is imported makes MLX
call it instead (the dynamic linker searches the global scope before a library's own
dependencies). That is ``LD_PRELOAD`` without re-executing the process, without leaking
into child processes, and with a way back: a library that fails its self-check is simply
never promoted to the global scope.

The self-check runs in a child process (``python -m vllmmlxd.runtime.blas PATH``), so a
library that crashes or calls ``exit()`` while loading cannot take the worker down. Once
mlx is loaded, ``engine.blas_check`` confirms that MLX really calls the library. On macOS
nothing is loaded: MLX uses Metal and Accelerate there.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import importlib.util
import json
import os
import site
import subprocess
import sys
import sysconfig
from dataclasses import asdict, dataclass, field
from pathlib import Path

PROBE_TIMEOUT_S = 30.0

# Self-check sizes: big enough that a threaded library really starts its threads.
_M, _N, _K = 48, 40, 36
_ROW_MAJOR, _NO_TRANS = 101, 111


@dataclass(frozen=True)
class BlasInfo:
    """What a worker runs with: shown in its log, /v1/status and ``vllmmlxctl status``."""

    name: str  # mkl | openblas | bundled | accelerate | the file name of a custom library
    path: str | None
    threads: int
    requested: str
    warning: str | None = None  # why the request was not met, when it fell back
    env: dict[str, str] = field(default_factory=dict)  # the threading variables it was given

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Candidate:
    name: str
    path: Path


# -- finding libraries ------------------------------------------------------


def _lib_dirs_of_prefixes() -> list[Path]:
    """Where pip puts a wheel's ``data/lib`` files (the ``mkl`` wheel's libraries) for this Python."""
    prefixes = [sysconfig.get_path("data"), sys.prefix, os.environ.get("CONDA_PREFIX")]
    try:
        prefixes.append(site.getuserbase())
    except AttributeError:  # some embedded Pythons lack it
        pass
    seen: list[Path] = []
    for prefix in filter(None, prefixes):
        lib = Path(prefix) / "lib"
        if lib not in seen:
            seen.append(lib)
    return seen


def find_mkl() -> Path | None:
    """``libmkl_rt`` from the ``mkl`` wheel (``vllmmlxd[linux-fast]``), a conda env or oneAPI."""
    for lib in _lib_dirs_of_prefixes():
        for name in ("libmkl_rt.so.3", "libmkl_rt.so.2", "libmkl_rt.so"):
            if (lib / name).is_file():
                return lib / name
    for pattern in ("/opt/intel/oneapi/mkl/latest/lib/libmkl_rt.so*", "/opt/intel/oneapi/mkl/latest/lib/intel64/libmkl_rt.so*"):
        found = sorted(glob.glob(pattern))
        if found:
            return Path(found[-1])
    return None


def find_openblas() -> Path | None:
    """A system OpenBLAS: Debian/Ubuntu ``libopenblas0-pthread``, Fedora ``openblas``, /usr/local builds."""
    arch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    dirs = [f"/usr/lib/{arch}/openblas-pthread", f"/usr/lib/{arch}/openblas-openmp", f"/usr/lib/{arch}",
            "/usr/lib64", "/usr/lib", "/usr/local/lib", f"/usr/lib/{arch}/openblas-serial"]
    for d in dirs:
        for name in ("libopenblas.so.0", "libopenblasp.so.0", "libopenblas.so"):
            if os.path.isfile(os.path.join(d, name)):
                return Path(d, name)
    found = ctypes.util.find_library("openblas")
    return Path(found) if found else None


def find_bundled() -> str | None:
    """The reference BLAS the ``mlx-cpu`` wheel ships (located without importing mlx)."""
    spec = importlib.util.find_spec("mlx")
    for location in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(glob.glob(str(Path(location).parent / "mlx_cpu.libs" / "libblas*.so*")))
        if found:
            return found[0]
    return None


def candidates(choice: str) -> tuple[list[Candidate], str | None]:
    """Libraries to try for ``choice``, best first, and why there are none when that happens."""
    if choice == "auto":
        found = [Candidate(n, p) for n, p in (("mkl", find_mkl()), ("openblas", find_openblas())) if p]
        hint = "pip install 'vllmmlxd[linux-fast]' (x86-64) or install OpenBLAS (Debian: libopenblas0-pthread)"
        return found, None if found else f"no optimised BLAS found; {hint}"
    if choice == "mkl":
        path = find_mkl()
        return ([Candidate("mkl", path)], None) if path else ([], "MKL not found: pip install 'vllmmlxd[linux-fast]' (x86-64 only)")
    if choice == "openblas":
        path = find_openblas()
        return ([Candidate("openblas", path)], None) if path else ([], "OpenBLAS not found (Debian: apt install libopenblas0-pthread)")
    path = Path(choice).expanduser()
    if not path.is_file():
        return [], f"{path}: no such file"
    return [Candidate(_family(path), path)], None


def _family(path: Path) -> str:
    stem = path.name.lower()
    for family in ("mkl", "openblas", "blis", "flexiblas"):
        if family in stem:
            return family
    return path.name


def thread_env(name: str, threads: int, path: Path | None = None) -> dict[str, str]:
    """The environment a library reads its threading from when it loads."""
    env = {"OMP_NUM_THREADS": str(threads)}
    if name == "mkl":
        env["MKL_NUM_THREADS"] = str(threads)
        # One thread: no OpenMP runtime at all. More: Intel's OpenMP, which the mkl wheel brings.
        layer = "SEQUENTIAL"
        if threads > 1:
            layer = "INTEL" if path is None or any(path.parent.glob("libiomp5.so*")) else "GNU"
        env["MKL_THREADING_LAYER"] = os.environ.get("MKL_THREADING_LAYER", layer)
    elif name == "openblas":
        env["OPENBLAS_NUM_THREADS"] = str(threads)
    return env


# -- the self-check ---------------------------------------------------------

# Order of summation tells the bundled reference BLAS (one running sum per output, in order)
# from an optimised one (blocked or vectorised sums): 1 + 4095 terms of 2^-25 stays exactly 1
# when added one by one, and does not when the small terms are summed among themselves first.
FINGERPRINT_K = 4096
FINGERPRINT_EPS = 2.0**-25


def fingerprint_operands() -> tuple[list[float], list[float], tuple[int, int, int]]:
    """A (2 x K) and B (K x 3), row-major, whose product is exactly 1.0 only under in-order sums."""
    m, n, k = 2, 3, FINGERPRINT_K
    a = [1.0 if col == 0 else FINGERPRINT_EPS for _ in range(m) for col in range(k)]
    return a, [1.0] * (k * n), (m, n, k)


def _operands() -> tuple[list[float], list[float]]:
    a = [((i * 7) % 11 - 5) / 4 for i in range(_M * _K)]
    b = [((i * 5) % 13 - 6) / 8 for i in range(_K * _N)]
    return a, b


def _reference(a: list[float], b: list[float]) -> list[float]:
    return [sum(a[i * _K + k] * b[k * _N + j] for k in range(_K)) for i in range(_M) for j in range(_N)]


def _floats(values: list[float]):
    return (ctypes.c_float * len(values))(*values)


def sgemm(lib: ctypes.CDLL, m: int, n: int, k: int, a, b, c) -> None:
    """C = A·B through ``cblas_sgemm``, row-major, for ctypes float arrays."""
    fn = lib.cblas_sgemm
    fn.restype = None
    fn(_ROW_MAJOR, _NO_TRANS, _NO_TRANS, m, n, k, ctypes.c_float(1.0), a, k, b, n, ctypes.c_float(0.0), c, n)


def self_check(path: str) -> tuple[str | None, bool]:
    """Load ``path`` locally and compare one small product with Python's.

    Returns (None when it passes, else the reason; whether it sums unlike the reference BLAS).
    """
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        return f"cannot load: {exc}", False
    if not hasattr(lib, "cblas_sgemm"):
        return "does not export cblas_sgemm", False
    a, b = _operands()
    c = (ctypes.c_float * (_M * _N))()
    sgemm(lib, _M, _N, _K, _floats(a), _floats(b), c)
    worst = max(abs(x - y) for x, y in zip(c, _reference(a, b)))
    if worst >= 1e-3:
        return f"wrong results from cblas_sgemm (off by {worst:.3g})", False
    fa, fb, (m, n, k) = fingerprint_operands()
    c = (ctypes.c_float * (m * n))()
    sgemm(lib, m, n, k, _floats(fa), _floats(fb), c)
    return None, c[0] != 1.0


def probe(candidate: Candidate, env: dict[str, str]) -> tuple[str | None, bool]:
    """Run :func:`self_check` in a child process: (None when it passes, else the reason; its sums differ)."""
    cmd = [sys.executable, "-m", "vllmmlxd.runtime.blas", str(candidate.path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env={**os.environ, **env})
    except subprocess.TimeoutExpired:
        return f"its self-check did not finish in {PROBE_TIMEOUT_S:.0f}s", False
    try:
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        return result["error"], bool(result["sums_differ"])
    except (IndexError, ValueError, KeyError, TypeError):
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "no output"
        return f"its self-check exited with code {proc.returncode}: {tail}", False


# -- activation -------------------------------------------------------------


@dataclass
class ActiveBlas:
    """The library MLX now calls (None: the bundled one).

    ``sums_differ``: its products carry a fingerprint unlike the reference BLAS, which lets
    the engine confirm that MLX really calls it.
    """

    info: BlasInfo
    lib: ctypes.CDLL | None = None
    sums_differ: bool = False


def activate(choice: str, threads: int, *, platform: str = sys.platform) -> ActiveBlas:
    """Make MLX's CPU backend use the library ``choice`` names, or fall back to the bundled one.

    Must run before mlx is imported. Never raises for a bad library: the reason comes back
    as ``info.warning``.
    """
    if not platform.startswith("linux"):
        warning = None if choice in ("auto", "bundled") else f"blas: {choice} applies on Linux only; MLX uses Accelerate here"
        return ActiveBlas(BlasInfo("accelerate", None, threads, choice, warning), None)
    bundled = BlasInfo("bundled", find_bundled(), 1, choice)
    if choice == "bundled":
        return ActiveBlas(bundled, None)
    if "mlx.core" in sys.modules:
        return ActiveBlas(_fallback(bundled, "mlx was imported before the BLAS was chosen"), None)
    found, why = candidates(choice)
    reasons = [why] if why else []
    for cand in found:
        env = thread_env(cand.name, threads, cand.path)
        error, sums_differ = probe(cand, env)
        if error:
            reasons.append(f"{cand.name} ({cand.path}): {error}")
            continue
        os.environ.update(env)
        lib = ctypes.CDLL(str(cand.path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
        info = BlasInfo(cand.name, str(cand.path.resolve()), threads, choice, "; ".join(reasons) or None, env)
        return ActiveBlas(info, lib, sums_differ)
    return ActiveBlas(_fallback(bundled, "; ".join(reasons) or "no library to try"), None)


def _fallback(bundled: BlasInfo, reason: str) -> BlasInfo:
    return BlasInfo(bundled.name, bundled.path, 1, bundled.requested, reason)


def _probe_main(argv: list[str]) -> int:
    try:
        error, sums_differ = self_check(argv[0])
    except Exception as exc:  # report, never crash without a word
        error, sums_differ = f"{type(exc).__name__}: {exc}", False
    print(json.dumps({"error": error, "sums_differ": sums_differ}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_probe_main(sys.argv[1:]))
