"""blas.py: finding, checking and loading a BLAS for MLX, each case in a fresh process
(loading a library into the global scope cannot be undone, and mlx must not be loaded yet)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vllmmlxd.runtime.blas import pick
from vllmmlxd.runtime.blas_find import FINDERS, Candidate, candidates, find_mkl, find_openblas, thread_env
from vllmmlxd.runtime.blas_probe import ProbeResult

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the BLAS choice applies on Linux")


def activate_in_child(choice: str, threads: int = 1, *, confirm: bool = False, before: str = "") -> dict:
    """Run ``activate`` in a new interpreter (optionally confirming through MLX) and return its BlasInfo."""
    code = (
        "import json, sys\n" + before + "from vllmmlxd.runtime.blas import activate\n"
        f"active = activate({choice!r}, {threads})\n"
        "info = active.info\n"
        + ("from vllmmlxd.engine.loading.blas_check import confirm\ninfo = confirm(active)\n" if confirm else "")
        + "print(json.dumps(info.as_dict()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@linux_only
def test_a_missing_library_falls_back_to_bundled_with_the_reason(tmp_path):
    info = activate_in_child(str(tmp_path / "libnothing.so"), 2)
    assert info["name"] == "bundled" and info["threads"] == 1
    assert info["warning"] == f"{tmp_path / 'libnothing.so'}: no such file"
    assert info["path"] and "libblas" in info["path"]  # the wheel's own library, named


@linux_only
def test_a_file_that_is_not_a_library_falls_back(tmp_path):
    junk = tmp_path / "libjunk.so"
    junk.write_bytes(b"not an ELF file" * 100)
    info = activate_in_child(str(junk))
    assert info["name"] == "bundled" and "cannot load" in info["warning"] and "invalid ELF header" in info["warning"]


@linux_only
def test_a_library_without_cblas_sgemm_falls_back():
    libm = next(
        (
            p
            for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/lib/aarch64-linux-gnu/libm.so.6", "/lib64/libm.so.6")
            if Path(p).exists()
        ),
        None,
    )
    if libm is None:
        pytest.skip("no libm.so.6 at a known path")
    info = activate_in_child(libm)
    assert info["name"] == "bundled" and info["warning"].endswith("does not export cblas_sgemm")


def _build_library(tmp_path: Path, body: str) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    src, lib = tmp_path / "fake.c", tmp_path / "libfakeblas.so"
    src.write_text("#include <stdlib.h>\n#include <signal.h>\n" + body)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    return lib


@linux_only
def test_a_library_that_crashes_in_its_self_check_cannot_take_the_worker_down(tmp_path):
    lib = _build_library(tmp_path, "void cblas_sgemm(void) { raise(SIGSEGV); }\n")
    info = activate_in_child(str(lib))
    assert info["name"] == "bundled"
    assert "self-check exited with code -11" in info["warning"]


@linux_only
def test_a_library_that_computes_wrong_results_is_refused(tmp_path):
    # Writes zeros: C is left untouched at 0 while the true product is not.
    body = (
        "void cblas_sgemm(int o, int ta, int tb, int m, int n, int k, float al, const float *a, int lda,"
        " const float *b, int ldb, float be, float *c, int ldc) { for (int i = 0; i < m * n; i++) c[i] = 0; }\n"
    )
    info = activate_in_child(str(_build_library(tmp_path, body)))
    assert (
        info["name"] == "bundled"
        and info["warning"].startswith("libfakeblas.so (")
        and "wrong results" in info["warning"]
    )


@linux_only
def test_the_choice_must_come_before_mlx_is_imported():
    info = activate_in_child("auto", before="import mlx.core\n")
    assert info["name"] == "bundled" and info["warning"] == "mlx was imported before the BLAS was chosen"


@linux_only
def test_bundled_is_taken_as_asked():
    info = activate_in_child("bundled", 4)
    assert info["name"] == "bundled" and info["warning"] is None and info["threads"] == 1


INSTALLED = [name for name, find in FINDERS.items() if find()]


@linux_only
@pytest.mark.skipif(not INSTALLED, reason="no optimised BLAS installed")
def test_auto_picks_an_installed_library_and_mlx_calls_it():
    info = activate_in_child("auto", 2, confirm=True)
    assert info["name"] in INSTALLED and info["warning"] is None and info["threads"] == 2
    assert Path(info["path"]).is_file()
    assert set(info["timings"]) == set(INSTALLED)  # every installed library was measured


def test_auto_takes_the_fastest_unless_the_first_is_within_the_margin():
    def result(ms):
        return ProbeResult(None, True, ms)

    mkl, blis, openblas = (Candidate(n, Path(f"/lib/{n}.so")) for n in ("mkl", "blis", "openblas"))
    assert pick([(mkl, result(10.0)), (blis, result(6.0)), (openblas, result(8.0))])[0] is blis
    assert pick([(mkl, result(10.0)), (blis, result(9.5))])[0] is mkl  # a near tie keeps the order
    assert pick([(mkl, result(None)), (blis, result(1.0))])[0] is mkl  # nothing to compare


@linux_only
@pytest.mark.skipif(find_openblas() is None, reason="no system OpenBLAS installed")
def test_the_fingerprint_tells_when_mlx_does_not_call_the_library():
    # OpenBLAS loaded privately (never promoted to the global scope): MLX keeps the bundled BLAS.
    code = (
        "import ctypes, os, json\nimport mlx.core\n"
        "from vllmmlxd.runtime.blas import ActiveBlas, BlasInfo\nfrom vllmmlxd.runtime.blas_find import find_openblas\n"
        "from vllmmlxd.engine.loading.blas_check import confirm\n"
        "lib = ctypes.CDLL(str(find_openblas()), mode=os.RTLD_NOW | os.RTLD_LOCAL)\n"
        "info = confirm(ActiveBlas(BlasInfo('openblas', str(find_openblas()), 1, 'openblas'), lib, sums_differ=True))\n"
        "print(json.dumps(info.as_dict()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    info = json.loads(out)
    assert info["name"] == "bundled" and info["warning"].startswith("MLX does not call openblas")


def test_thread_environment():
    assert thread_env("mkl", 1)["MKL_THREADING_LAYER"] == "SEQUENTIAL"
    env = thread_env("mkl", 4)
    assert env["MKL_NUM_THREADS"] == "4" and env["MKL_THREADING_LAYER"] == "INTEL" and env["OMP_NUM_THREADS"] == "4"
    assert thread_env("openblas", 3) == {"OMP_NUM_THREADS": "3", "OPENBLAS_NUM_THREADS": "3"}


def test_candidates_name_what_is_missing(tmp_path):
    found, why = candidates(str(tmp_path / "libx.so"))
    assert found == [] and why.endswith("libx.so: no such file")
    if find_mkl() is None:
        assert "vllmmlxd[linux-fast]" in candidates("mkl")[1]
    assert candidates("/opt/x/libblis.so.4")[1].endswith("no such file")


def test_macos_never_loads_anything():
    from vllmmlxd.runtime.blas import activate

    active = activate("mkl", 8, platform="darwin")
    assert active.lib is None and active.info.name == "accelerate"
    assert "applies on Linux only" in active.info.warning
    assert activate("auto", 8, platform="darwin").info.warning is None


@linux_only
def test_a_finished_self_check_is_remembered_per_file(tmp_path, monkeypatch):
    from vllmmlxd.runtime import blas_probe

    lib = tmp_path / "libjunk.so"
    lib.write_bytes(b"not an ELF file" * 100)
    first = blas_probe.probe(str(lib), {"OMP_NUM_THREADS": "1"}, tmp_path / "memo")
    assert "invalid ELF header" in first.error and len(list((tmp_path / "memo").glob("*.json"))) == 1

    def no_child(*args, **kwargs):
        raise AssertionError("the remembered result should have been used")

    monkeypatch.setattr(blas_probe.subprocess, "run", no_child)
    assert blas_probe.probe(str(lib), {"OMP_NUM_THREADS": "1"}, tmp_path / "memo") == first
    # Another thread count, or a changed file, is a new check.
    with pytest.raises(AssertionError):
        blas_probe.probe(str(lib), {"OMP_NUM_THREADS": "2"}, tmp_path / "memo")
    lib.write_bytes(b"another file" * 100)
    with pytest.raises(AssertionError):
        blas_probe.probe(str(lib), {"OMP_NUM_THREADS": "1"}, tmp_path / "memo")
