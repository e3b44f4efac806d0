"""Sharded entries of the families that are not llama-shaped, on the real daemon: a Qwen3.5-shaped
model (gated-delta layers beside attention) split by pipeline, and a GPT-OSS-shaped one (sliding
windows, experts, attention sinks) split by tensor, each as 2 ranks on loopback with MLX's ring
backend, answer as the same model in one process does, and a resend is a prefix-cache hit (whole
sequences: a sharded entry's windowed or recurrent layers are not held in blocks). The models
are tests/support/families.py's, speaking builtin:tiny's tokenizer; every process runs one BLAS
thread, so a layer computes the same in a rank and alone."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.test_daemon_sharded import free_ring_ports
from tests.support.daemon import free_port, make_daemon
from tests.support.families import save
from vllmmlxd.engine.loading.builtin import ensure_builtin

pytestmark = pytest.mark.timeout(400)
SPLITS = {"qwen3_5": "pipeline", "gpt_oss": "tensor"}
PROMPTS = ["Rule 1: item 1 is on shelf 1. Rule 2: item 2 is on shelf 2. Where is item 2?", "Say hello."]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = make_daemon()
    folder = tmp_path_factory.mktemp("models")
    tiny = ensure_builtin("tiny", d.state_dir)
    entries, ports = {}, {}
    for family, split in SPLITS.items():
        path = str(save(family, "float32", folder / family, tokenizer_from=tiny))
        for name, extra in ((family, {}), (f"{family}-{split}", {"distributed": _ranks(split)})):
            ports[name] = free_port()
            entries[name] = {"model": path, "port": ports[name], "threads": 1, "cache_memory_mb": 64, **extra}
    d.write(entries)
    d.start()
    d.wait_ready(set(entries), timeout=300)
    clients = {name: httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) for name, port in ports.items()}
    yield d, clients
    for c in clients.values():
        c.close()
    d.stop()


def _ranks(split: str) -> dict:
    return {"hosts": ["127.0.0.1", "127.0.0.1"], "backend": "ring", "parallel": split, "port": free_ring_ports()}


def greedy(client: httpx.Client, prompt: str) -> tuple[str, int]:
    """12 greedy tokens' text, and the prompt tokens the prefix cache served."""
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"], r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.parametrize("family", sorted(SPLITS))
def test_a_split_family_answers_as_one_process_does_and_hits_its_prefix_cache(cluster, family):
    _d, c = cluster
    split = f"{family}-{SPLITS[family]}"
    for prompt in PROMPTS:
        alone, _ = greedy(c[family], prompt)
        first, cached = greedy(c[split], prompt)
        assert (first, cached) == (alone, 0)
        again, cached = greedy(c[split], prompt)
        assert again == alone and (cached > 0) == (family == "gpt_oss"), cached
    status = c[split].get("/v1/status").json()
    assert status["distributed"]["world"] == 2 and status["cache"]["type"] == "prefix_lru"
    assert status["layout"]["prefix_cache"] == "sequences"
    assert status["layout"]["speculation"] == {
        "off": "a sharded entry's other ranks play rank 0's batch token by token"
    }
