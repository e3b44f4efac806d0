"""Sharded entries on the real daemon: a llama as 2 ranks on loopback with MLX's ring backend,
split by pipeline and by tensor, beside the same model in one process. The model is
tests/support/families.py's (4 layers, random weights whose top two tokens are far apart)
speaking builtin:tiny's tokenizer.

Greedy output of each split equals the single process's (token for token by pipeline; the first
8 tokens by tensor, whose sums run in another order); both API families, streaming, 4 concurrent
requests, structured output, a prefix-cache hit and a cancelled stream work through rank 0
while rank 1 follows; SIGTERM of the daemon leaves no rank. Every process runs one BLAS thread,
so the numerics of a layer are the same in a rank and in the single process. A second daemon
runs builtin:tiny's ranks (fast to restart): a hung rank or a killed one brings the unit back by
itself, and kill -9 of the daemon leaves no rank.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import socket

import httpx
import pytest

from tests.support.daemon import free_port, make_daemon, wait_gone
from tests.support.families import save
from vllmmlxd.engine.loading.builtin import ensure_builtin

pytestmark = pytest.mark.timeout(400)
PROMPTS = ["Explain unified memory in two sentences."]
LAYERS = 4  # the families' llama: 4 attention heads, 2 KV heads of 16 dimensions


def free_ring_ports() -> int:
    """A base port whose next one is free too (a 2-rank ring listens on both)."""
    for _ in range(50):
        base = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
        return base
    raise RuntimeError("no two free ports in a row")


def entry(model: str, port: int, **extra) -> dict:
    return {"model": model, "port": port, "threads": 1, "cache_memory_mb": 64, **extra}


def ranks(split: str) -> dict:
    return {"hosts": ["127.0.0.1", "127.0.0.1"], "backend": "ring", "parallel": split, "port": free_ring_ports()}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = make_daemon()
    tiny = ensure_builtin("tiny", d.state_dir)
    model = str(
        save(
            "llama",
            "float32",
            tmp_path_factory.mktemp("models") / "llama",
            tokenizer_from=tiny,
            num_hidden_layers=LAYERS,
        )
    )
    ports = {"one": free_port(), "pipe": free_port(), "tensor": free_port()}
    d.write(
        {
            "one": entry(model, ports["one"]),
            "pipe": entry(model, ports["pipe"], distributed=ranks("pipeline")),
            "tensor": entry(model, ports["tensor"], distributed=ranks("tensor")),
        }
    )
    d.start()
    d.wait_ready(list(ports), timeout=240)
    clients = {name: httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120) for name, port in ports.items()}
    yield d, clients
    for c in clients.values():
        c.close()
    if d.proc is not None and d.proc.poll() is None:
        d.stop()


def greedy(client: httpx.Client, prompt: str, n: int) -> str:
    """The text of the first ``n`` greedy tokens (no logprobs here: the same tokens, the same text)."""
    r = client.post("/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == n
    return r.json()["choices"][0]["text"]


def rank_pids(d, name: str) -> list[int]:
    return [r["pid"] for r in d.models()[name]["ranks"]]


def test_each_split_answers_as_the_single_process_does(cluster):
    d, c = cluster
    for prompt in PROMPTS:
        assert greedy(c["pipe"], prompt, 16) == greedy(c["one"], prompt, 16)
        assert greedy(c["tensor"], prompt, 8) == greedy(c["one"], prompt, 8)
    shown = d.ctl("status").stdout
    assert "pipe: pipeline over 2 ranks (ring)" in shown and "layers 0-1 of 4" in shown and "layers 2-3 of 4" in shown
    assert "tensor: tensor over 2 ranks (ring)" in shown and "heads 2 of 4" in shown
    status = c["pipe"].get("/v1/status").json()["distributed"]
    assert status["world"] == 2 and [r["rank"] for r in status["ranks"]] == [0, 1]
    assert status["ranks"][1]["step_ms"] is not None  # rank 1 reports its steps with each frame
    # Rank 0 admits by its share of the KV, read from its own caches without running a collective:
    # 4 layers x 2 KV heads x 16 x 2 x float32 whole; layers 0-1 of them; 1 of the 2 KV heads.
    per_token = {name: c[name].get("/v1/status").json()["kv_budget"]["bytes_per_token"] for name in c}
    assert per_token == {"one": 1_024, "pipe": 512, "tensor": 512}


def test_rank_zero_serves_everything_while_rank_one_follows(cluster):
    d, c = cluster
    pipe = c["pipe"]
    # 4 at once (sampled, seeded: the same seed answers the same on a rerun) and a stream.
    bodies = [
        {"messages": [{"role": "user", "content": f"Say something about {i}."}], "max_tokens": 8, "seed": i}
        for i in range(4)
    ]
    with cf.ThreadPoolExecutor(4) as pool:
        first = list(pool.map(lambda b: pipe.post("/v1/chat/completions", json=b), bodies))
    assert [r.status_code for r in first] == [200] * 4
    again = pipe.post("/v1/chat/completions", json=bodies[2])
    assert again.json()["choices"][0]["message"] == first[2].json()["choices"][0]["message"]
    # The resent conversation is a prefix-cache hit on rank 0 (its KV mirrored on rank 1).
    hits = pipe.get("/v1/status").json()["cache"]["hits"]
    assert hits >= 1
    with pipe.stream("POST", "/v1/chat/completions", json={**bodies[0], "stream": True}) as stream:
        lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 3
    # Anthropic's API and structured output, through the same lockstep.
    messages = pipe.post(
        "/v1/messages",
        json={"model": "pipe", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]},
        headers={"anthropic-version": "2023-06-01"},
    )
    assert messages.status_code == 200 and messages.json()["content"][0]["type"] == "text"
    schema = {
        "type": "object",
        "properties": {"colour": {"type": "string", "maxLength": 12}},
        "required": ["colour"],
        "additionalProperties": False,
    }
    shaped = pipe.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "Name a colour as JSON."}],
            "max_tokens": 40,
            "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        },
    )
    assert set(json.loads(shaped.json()["choices"][0]["message"]["content"])) == {"colour"}
    # A stream cancelled after a few events; the ranks stay in step: the next request answers.
    with pipe.stream("POST", "/v1/chat/completions", json={**bodies[1], "max_tokens": 200, "stream": True}) as s:
        for n, _ in enumerate(s.iter_lines()):
            if n > 4:
                break
    assert greedy(pipe, PROMPTS[0], 4) == greedy(c["one"], PROMPTS[0], 4)
    assert d.models()["pipe"]["restarts"] == 0


def test_sigterm_of_the_daemon_leaves_no_rank(cluster):
    d, _ = cluster
    pids = [p for name in ("pipe", "tensor") for p in rank_pids(d, name)] + d.worker_pids()
    assert len(set(pids)) == 5
    code = d.stop()
    assert code == 0, d.log()[-3000:]
    assert wait_gone(pids)


def test_a_hung_rank_or_a_killed_one_restarts_the_unit_and_kill_9_of_the_daemon_leaves_no_rank():
    # builtin:tiny loads fast: a unit of its own, so the cluster above is not lost. Rank 0 exchanges
    # a frame with the others every 250 ms: a rank that stops (SIGSTOP) silences it, /health says
    # degraded after VLLMMLXD_STUCK_AFTER_S, and the failed checks restart every rank.
    d = make_daemon()
    port = free_port()
    d.write({"t": {"model": "builtin:tiny", "port": port, "threads": 1, "distributed": ranks("tensor")}})
    d.start(env={"VLLMMLXD_STUCK_AFTER_S": "2", "VLLMMLXD_HEALTH_INTERVAL_S": "0.5", "VLLMMLXD_HEALTH_FAILURES": "2"})
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=120)
    try:
        d.wait_ready(["t"], timeout=180)
        before = greedy(client, PROMPTS[0], 8)
        hung = [r["pid"] for r in d.models()["t"]["ranks"]]
        os.kill(hung[1], signal.SIGSTOP)
        # Restarted: new ranks spawned in place of both old ones.
        d.wait_for(
            lambda ms: ms["t"]["restarts"] == 1 and not {r["pid"] for r in ms["t"]["ranks"]} & {*hung, None},
            timeout=120,
            what="t restarted with new ranks",
        )
        assert wait_gone(hung)
        assert "event=worker.unhealthy" in d.log()

        # kill -9 of rank 1: the unit comes back by itself, rank 0 gone with the old one.
        d.wait_for(lambda ms: ms["t"]["state"] == "ready", timeout=120, what="t ready after the hang")
        killed = [r["pid"] for r in d.models()["t"]["ranks"]]
        os.kill(killed[1], signal.SIGKILL)
        d.wait_for(  # one snapshot: its state and its ranks' pids
            lambda ms: ms["t"]["state"] == "ready" and not {r["pid"] for r in ms["t"]["ranks"]} & {*killed, None},
            timeout=120,
            what="t ready again with new ranks",
        )
        assert wait_gone(killed)
        assert d.models()["t"]["restarts"] == 2
        assert greedy(client, PROMPTS[0], 8) == before  # the same split of the same weights answers the same

        pids = [r["pid"] for r in d.models()["t"]["ranks"]]
        assert d.proc is not None
        d.proc.kill()  # no drain, no stop frame: the ranks see their stdin close
        d.proc.wait(timeout=10)
        assert wait_gone(pids)
    finally:
        client.close()
        if d.proc is not None and d.proc.poll() is None:
            d.stop()
