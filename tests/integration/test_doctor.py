"""``vllmmlxctl doctor --json`` run as a user runs it, on builtin:tiny: every engine path agrees with
mlx-lm here; and when a build breaks one path (a sitecustomize.py on the child interpreter's
PYTHONPATH scales the KV the plain prefix cache joins back), the doctor exits non-zero naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vllmmlxd.ctl import exit_codes

REPO = Path(__file__).resolve().parents[2]

# Patched once the engine imports the module (an import hook): the doctor itself never imports
# mlx, and the self-test's process still chooses its BLAS before mlx loads. Only blocks held whole
# (kv_bits unset) are corrupted: the quantized KV cache's path, which joins blocks too, stays right.
BREAK_PREFIX_CACHE = """
import importlib.abc, importlib.util, sys

TARGET = "vllmmlxd.engine.cache.kv"


def patch(kv):
    join = kv.BlockKV.join_arrays

    def corrupt(self, blocks, n):
        keys, values = join(self, blocks, n)
        return (keys, -values[..., ::-1, :]) if self.bits is None else (keys, values)

    kv.BlockKV.join_arrays = corrupt


class AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, AfterImport())
"""


def doctor(tmp_path: Path, *args: str, breaker: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``vllmmlxctl doctor ARGS`` in a child, away from this user's config and daemon (the state
    dir stays the suite's, where builtin:tiny is built); ``breaker``: a folder put first on PYTHONPATH."""
    env = {
        **os.environ,
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "VLLMMLXD_SOCKET": str(tmp_path / "none.sock"),
        "PYTHONPATH": os.pathsep.join([str(p) for p in (breaker, REPO) if p is not None]),
    }
    env.pop("HOMEBREW_PREFIX", None)
    command = [sys.executable, "-m", "vllmmlxd.ctl", "doctor", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)


def test_the_doctor_passes_here_with_every_engine_path_as_mlx_lm(tmp_path, state_dir):
    done = doctor(tmp_path, "--json")
    report = json.loads(done.stdout)
    assert done.returncode == exit_codes.OK, (report["summary"], done.stderr)
    assert report["ok"] and report["failed"] == []
    engine = {c["name"]: c for c in report["checks"] if c["part"] == "engine"}
    assert set(engine) == {"load", "batch", "prefix_cache", "speculation", "kv_quantized"}
    assert all(c["level"] == "ok" for c in engine.values()), engine
    assert all(c["data"]["cached"] and all(c["data"]["cached"]) for n, c in engine.items() if "cache" in n or "kv" in n)
    assert engine["speculation"]["data"]["drafted"] > 0
    assert all(c["seconds"] is not None for c in engine.values())
    parts = {c["part"] for c in report["checks"]}
    assert parts >= {"versions", "device", "state", "config", "service", "engine"}
    daemon = next(c for c in report["checks"] if c["name"] == "daemon")
    assert daemon["level"] == "warn"  # no daemon here: a warning, not a failure


def test_the_doctor_fails_naming_the_one_broken_engine_path(tmp_path, state_dir):
    breaker = tmp_path / "broken"
    breaker.mkdir()
    (breaker / "sitecustomize.py").write_text(BREAK_PREFIX_CACHE)
    done = doctor(tmp_path, "--json", breaker=breaker)
    report = json.loads(done.stdout)
    assert done.returncode == exit_codes.DOCTOR_FAILED, (report["summary"], done.stderr)
    assert report["failed"] == ["engine.prefix_cache"] and report["summary"] == "FAILED: engine.prefix_cache"
    broken = next(c for c in report["checks"] if c["name"] == "prefix_cache")
    assert broken["detail"].startswith("differs from mlx-lm: prefix_cache prompt")
    text = doctor(tmp_path, breaker=breaker)  # the text report names it too
    assert text.returncode == exit_codes.DOCTOR_FAILED
    assert "  FAIL  prefix_cache  differs from mlx-lm" in text.stdout
    assert text.stdout.rstrip().endswith("FAILED: engine.prefix_cache")
