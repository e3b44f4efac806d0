"""The self-check a BLAS library passes before a worker loads it: run in a child process.

    python -m vllmmlxd.runtime.blas_probe PATH    → one JSON line: error, sums_differ, gemv_ms

A child process, so that a library that crashes or calls ``exit()`` while loading cannot
take the worker down. Stdlib only (ctypes), so it starts fast.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

TIMEOUT_S = 30.0

# Correctness sizes: big enough that a threaded library really starts its threads.
_M, _N, _K = 48, 40, 36
_ROW_MAJOR, _NO_TRANS, _TRANS = 101, 111, 112

# Order of summation tells the bundled reference BLAS (one running sum per output, in order)
# from an optimised one (blocked or vectorised sums): 1 + 4095 terms of 2^-25 stays exactly 1
# when added one by one, and does not when the small terms are summed among themselves first.
FINGERPRINT_K = 4096
FINGERPRINT_EPS = 2.0**-25

# A decode step is matrix-vector products over weights streamed from memory: time a sweep of
# such products (row-major weights, transposed, as MLX's Linear calls them) over 64 MB, more
# than a CPU cache holds. 2048-wide separates the libraries as a real decode does.
_GEMV_SIDE, _GEMV_MATRICES = 2048, 4


@dataclass(frozen=True)
class ProbeResult:
    error: str | None  # None: the library passed
    sums_differ: bool = False  # its sums carry a fingerprint unlike the reference BLAS's
    gemv_ms: float | None = None  # its decode-shaped product, best of three


def fingerprint_operands() -> tuple[list[float], list[float], tuple[int, int, int]]:
    """A (2 x K) and B (K x 3), row-major, whose product is exactly 1.0 only under in-order sums."""
    m, n, k = 2, 3, FINGERPRINT_K
    a = [1.0 if col == 0 else FINGERPRINT_EPS for _ in range(m) for col in range(k)]
    return a, [1.0] * (k * n), (m, n, k)


def _floats(values: list[float]) -> ctypes.Array[ctypes.c_float]:
    return (ctypes.c_float * len(values))(*values)


def sgemm(
    lib: ctypes.CDLL,
    m: int,
    n: int,
    k: int,
    a: ctypes.Array[ctypes.c_float],
    b: ctypes.Array[ctypes.c_float],
    c: ctypes.Array[ctypes.c_float],
    *,
    trans_b: bool = False,
) -> None:
    """C = A·B (or A·Bᵀ) through ``cblas_sgemm``, row-major, for ctypes float buffers."""
    fn = lib.cblas_sgemm
    fn.restype = None
    ldb = k if trans_b else n
    fn(
        _ROW_MAJOR,
        _NO_TRANS,
        _TRANS if trans_b else _NO_TRANS,
        m,
        n,
        k,
        ctypes.c_float(1.0),
        a,
        k,
        b,
        ldb,
        ctypes.c_float(0.0),
        c,
        n,
    )


def _check_product(lib: ctypes.CDLL) -> str | None:
    a = [((i * 7) % 11 - 5) / 4 for i in range(_M * _K)]
    b = [((i * 5) % 13 - 6) / 8 for i in range(_K * _N)]
    c = (ctypes.c_float * (_M * _N))()
    sgemm(lib, _M, _N, _K, _floats(a), _floats(b), c)
    expected = [sum(a[i * _K + k] * b[k * _N + j] for k in range(_K)) for i in range(_M) for j in range(_N)]
    worst = max(abs(x - y) for x, y in zip(c, expected))
    return None if worst < 1e-3 else f"wrong results from cblas_sgemm (off by {worst:.3g})"


def _gemv_ms(lib: ctypes.CDLL) -> float:
    n = _GEMV_SIDE
    matrices = [(ctypes.c_float * (n * n))() for _ in range(_GEMV_MATRICES)]
    for w in matrices:
        ctypes.memset(w, 0x3F, ctypes.sizeof(w))  # every page touched; each float 0.75
    x, y = _floats([0.5] * n), (ctypes.c_float * n)()
    best = float("inf")
    for _ in range(4):  # the first sweep may load kernels or start threads
        started = time.perf_counter()
        for w in matrices:
            sgemm(lib, 1, n, n, x, w, y, trans_b=True)
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def self_check(path: str) -> ProbeResult:
    """Load ``path`` privately, check one product against Python's, fingerprint and time it."""
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOW | os.RTLD_LOCAL)
    except OSError as exc:
        return ProbeResult(f"cannot load: {exc}")
    if not hasattr(lib, "cblas_sgemm"):
        return ProbeResult("does not export cblas_sgemm")
    error = _check_product(lib)
    if error:
        return ProbeResult(error)
    fa, fb, (m, n, k) = fingerprint_operands()
    c = (ctypes.c_float * (m * n))()
    sgemm(lib, m, n, k, _floats(fa), _floats(fb), c)
    return ProbeResult(None, c[0] != 1.0, round(_gemv_ms(lib), 3))


def probe(path: str, env: dict[str, str], memo_dir: Path | None = None) -> ProbeResult:
    """Run :func:`self_check` in a child process with the library's threading ``env``.

    With ``memo_dir``, a finished check of the same file (size and mtime), environment and
    CPU is remembered there: later workers start without re-running it, and ``auto``'s choice
    stays the same from one start to the next instead of following timing noise.
    """
    memo = memo_dir / f"{_memo_key(path, env)}.json" if memo_dir is not None else None
    if memo is not None:
        try:
            return ProbeResult(**json.loads(memo.read_text()))
        except (OSError, ValueError, TypeError):
            pass
    cmd = [sys.executable, "-m", "vllmmlxd.runtime.blas_probe", path]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env={**os.environ, **env})
    except subprocess.TimeoutExpired:  # maybe a busy machine: not remembered
        return ProbeResult(f"its self-check did not finish in {TIMEOUT_S:.0f}s")
    try:
        result = ProbeResult(**json.loads(proc.stdout.strip().splitlines()[-1]))
    except (IndexError, ValueError, TypeError):
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:]) or "no output"
        result = ProbeResult(f"its self-check exited with code {proc.returncode}: {tail}")
    if memo is not None:
        _remember(memo, result)
    return result


def _memo_key(path: str, env: dict[str, str]) -> str:
    try:
        st = os.stat(path)
        stamp = [os.path.realpath(path), st.st_size, st.st_mtime_ns]
    except OSError:
        stamp = [path]
    cpu = platform.processor() or platform.machine()
    data = json.dumps([stamp, sorted(env.items()), cpu, os.cpu_count(), sys.executable])
    return hashlib.sha256(data.encode()).hexdigest()[:24]


def _remember(memo: Path, result: ProbeResult) -> None:
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(result)))
        os.replace(tmp, memo)  # atomic: workers starting together never read half a file
    except OSError:
        pass  # a read-only state dir only costs the next worker a probe


def main(argv: list[str]) -> int:
    try:
        result = self_check(argv[0])
    except Exception as exc:  # report, never crash without a word
        result = ProbeResult(f"{type(exc).__name__}: {exc}")
    print(json.dumps(asdict(result)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
