"""Where BLAS libraries live on Linux, and the threading variables each one reads. Stdlib only."""

from __future__ import annotations

import contextlib
import ctypes.util
import glob
import importlib.util
import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from vllmmlxd.extras import install_hint

# Tried in this order by `blas: auto`; the fastest at a decode-shaped product wins (see blas.py).
AUTO_ORDER = ("mkl", "blis", "openblas")
INSTALL_HINTS = {
    "mkl": install_hint("linux-fast") + " (x86-64 only)",
    "blis": "Debian/Ubuntu: apt install libblis4-pthread",
    "openblas": "Debian/Ubuntu: apt install libopenblas0-pthread",
}


@dataclass(frozen=True)
class Candidate:
    name: str
    path: Path


def _lib_dirs_of_prefixes() -> list[Path]:
    """Where pip puts a wheel's ``data/lib`` files (the ``mkl`` wheel's libraries) for this Python."""
    prefixes = [sysconfig.get_path("data"), sys.prefix, os.environ.get("CONDA_PREFIX")]
    with contextlib.suppress(AttributeError):  # some embedded Pythons lack it
        prefixes.append(site.getuserbase())
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
    for pattern in (
        "/opt/intel/oneapi/mkl/latest/lib/libmkl_rt.so*",
        "/opt/intel/oneapi/mkl/latest/lib/intel64/libmkl_rt.so*",
    ):
        found = sorted(glob.glob(pattern))
        if found:
            return Path(found[-1])
    return None


def _find_system(family: str, names: tuple[str, ...]) -> Path | None:
    """A distribution's library: its pthread build first (Debian's alternatives), then the usual dirs."""
    arch = sysconfig.get_config_var("MULTIARCH") or f"{os.uname().machine}-linux-gnu"
    dirs = [
        f"/usr/lib/{arch}/{family}-pthread",
        f"/usr/lib/{arch}/{family}-openmp",
        f"/usr/lib/{arch}",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        f"/usr/lib/{arch}/{family}-serial",
    ]
    for d in dirs:
        for name in names:
            if os.path.isfile(os.path.join(d, name)):
                return Path(d, name)
    found = ctypes.util.find_library(family)
    return Path(found) if found else None


def find_openblas() -> Path | None:
    """A system OpenBLAS: Debian/Ubuntu ``libopenblas0-pthread``, Fedora ``openblas``, /usr/local builds."""
    return _find_system("openblas", ("libopenblas.so.0", "libopenblasp.so.0", "libopenblas.so"))


def find_blis() -> Path | None:
    """A system BLIS: Debian/Ubuntu ``libblis4-pthread``, Fedora ``blis``, /usr/local builds."""
    return _find_system("blis", ("libblis.so.4", "libblis-mt.so.4", "libblis.so.3", "libblis.so"))


FINDERS = {"mkl": find_mkl, "blis": find_blis, "openblas": find_openblas}


def find_bundled() -> str | None:
    """The reference BLAS the ``mlx-cpu`` wheel ships (located without importing mlx)."""
    spec = importlib.util.find_spec("mlx")
    for location in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(glob.glob(str(Path(location).parent / "mlx_cpu.libs" / "libblas*.so*")))
        if found:
            return found[0]
    return None


def candidates(choice: str) -> tuple[list[Candidate], str | None]:
    """Libraries to try for ``choice``, in :data:`AUTO_ORDER`, and why there are none when that happens."""
    if choice == "auto":
        found = [Candidate(name, path) for name in AUTO_ORDER if (path := FINDERS[name]())]
        hints = "; ".join(f"{name}: {hint}" for name, hint in INSTALL_HINTS.items())
        return found, None if found else f"no optimised BLAS found ({hints})"
    if choice in FINDERS:
        path = FINDERS[choice]()
        return ([Candidate(choice, path)], None) if path else ([], f"{choice} not found ({INSTALL_HINTS[choice]})")
    path = Path(choice).expanduser()
    if not path.is_file():
        return [], f"{path}: no such file"
    return [Candidate(family_of(path), path)], None


def family_of(path: Path) -> str:
    """``mkl``, ``openblas``, ``blis`` from a library's file name, else the file name itself."""
    stem = path.name.lower()
    return next((family for family in (*AUTO_ORDER, "flexiblas") if family in stem), path.name)


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
    elif name == "blis":
        env["BLIS_NUM_THREADS"] = str(threads)
    return env
