"""The BLAS a worker runs on: a bad library falls back with a warning, `auto` finds a real one,
and the engine's outputs do not depend on which library multiplies."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.support.families import save
from tests.support.servers import start_serve, version_fields
from vllmmlxd.engine.loading.builtin import ensure_builtin
from vllmmlxd.paths import resolve_state_dir
from vllmmlxd.runtime.blas_find import FINDERS
from vllmmlxd.runtime.cpus import default_threads

INSTALLED = [name for name, find in FINDERS.items() if find()]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the BLAS choice applies on Linux")


def runtime_of(server) -> dict:
    return httpx.get(server.url + "/v1/status").json()["runtime"]


def test_a_bogus_library_path_serves_on_bundled_with_a_warning(tmp_path):
    bogus = tmp_path / "libnotablas.so"
    server = start_serve("builtin:tiny", "--blas", str(bogus), "--threads", "2")
    try:
        runtime = runtime_of(server)
        assert runtime["blas"] == "bundled" and runtime["threads"] == 1
        assert runtime["blas_warning"] == f"{bogus}: no such file"
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 3})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        # The runtime is for the daemon's private socket and authenticated status, not public /health.
        assert httpx.get(server.url + "/health").json() == {"status": "ok", "model": "builtin:tiny", **version_fields()}
    finally:
        assert server.stop() == 0
    log = server.log()
    assert "event=blas.fallback" in log and "level=warning" in log and f'reason="{bogus}: no such file"' in log


@pytest.mark.skipif(not INSTALLED, reason="no optimised BLAS installed")
def test_auto_serves_on_a_real_library_with_every_core():
    server = start_serve("builtin:tiny", threads=None)  # the default: one thread fewer than the cores
    try:
        runtime = runtime_of(server)
    finally:
        server.stop()
    assert runtime["blas"] in INSTALLED
    assert "blas_warning" not in runtime and runtime["pinned"] is False
    assert runtime["threads"] == default_threads(len(__import__("os").sched_getaffinity(0)))
    assert "event=blas.selected" in server.log() and f"blas={runtime['blas']}" in server.log()


# The second model has SmolLM2-135M's matrix sizes (the libraries' kernels at real sizes) in 2 layers of
# random weights whose top two tokens are far apart (tests/support/families.py).
REAL_SIZES: dict[str, Any] = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_attention_heads=9,
    num_key_value_heads=3,
    head_dim=64,
    num_hidden_layers=2,
)


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> list[str]:
    tiny = ensure_builtin("tiny", resolve_state_dir())
    folder = tmp_path_factory.mktemp("models") / "real-sizes"
    return ["builtin:tiny", str(save("llama", "float32", folder, tokenizer_from=tiny, **REAL_SIZES))]


def greedy(blas: str, tokens: int, models: list[str]) -> dict[str, dict]:
    """Each model's greedy run on ``blas``, in one process (the library is chosen once per process)."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.greedy", blas, str(tokens), *models],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [json.loads(line) for line in proc.stdout.strip().splitlines() if line.startswith("{")]
    return {run["model"]: run for run in runs}


@pytest.mark.slow
def test_each_model_gives_the_same_greedy_text_and_logits_on_every_blas(models):
    choices = ["bundled", *INSTALLED]
    if len(choices) < 2:
        pytest.skip("only the bundled BLAS is installed")
    # The bundled library is 20x slower: the real sizes are compared across the optimised ones, tiny on all.
    runs = {choice: greedy(choice, 6, models if choice != "bundled" else models[:1]) for choice in choices}
    for model in models:
        each = {choice: run[model] for choice, run in runs.items() if model in run}
        assert [r["blas"] for r in each.values()] == [c for c in choices if c in each]  # each ran on its library
        assert len(each) >= 2, (model, list(each))
        reference = next(iter(each.values()))
        scale = max(abs(x) for x in reference["logits"])
        for choice, run in each.items():
            assert run["tokens"] == reference["tokens"], (model, choice, run["text"], reference["text"])
            worst = max(abs(a - b) for a, b in zip(run["logits"], reference["logits"]))
            assert worst <= 1e-4 * scale, f"{model} on {choice}: logits differ by {worst} (scale {scale})"
