"""The prefix cache's blocks on a real worker (builtin:tiny, real MLX KV): a system prompt shared by
eight conversations is held once, eviction under a small budget keeps the blocks every conversation
uses, and ``kv_bits: 8`` holds the KV in about a quarter of float32's bytes, as /v1/status reports."""

from __future__ import annotations

import httpx
import pytest

from tests.support.servers import start_serve

# About 1,500 tokens of builtin:tiny's (SmolLM2's) vocabulary.
SYSTEM = " ".join(f"Rule {i}: item {i} is on shelf {i % 7}." for i in range(118))


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny", "--timeout", "120")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def cache(server) -> dict:
    return httpx.get(server.url + "/v1/status").json()["cache"]


def chat(server, user: str, system: str = SYSTEM) -> tuple[dict, int]:
    """One greedy turn; returns the response and the prompt tokens the prefix cache served it."""
    before = cache(server)["cached_tokens"]
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": 6,
            "temperature": 0,
        },
        timeout=120,
    )
    assert r.status_code == 200, r.text
    return r.json(), cache(server)["cached_tokens"] - before


def test_eight_conversations_sharing_a_system_prompt_hold_it_once(server):
    start = cache(server)
    assert start["type"] == "prefix_blocks" and start["block_tokens"] == 32
    first, served = chat(server, "Where is item 0?")
    assert first["usage"]["prompt_tokens"] >= 1500 and served == 0
    one = cache(server)["memory_bytes"] - start["memory_bytes"]
    for i in range(1, 8):
        _, served = chat(server, f"Where is item {i}?")
        assert served >= 1472  # every whole block of the system prompt
    eight = cache(server)["memory_bytes"] - start["memory_bytes"]
    assert cache(server)["evictions"] == 0
    assert one > 0 and eight <= 1.3 * one, (one, eight)


def test_eviction_keeps_the_blocks_every_conversation_uses():
    s = start_serve("builtin:tiny", "--cache-memory-mb", "1", "--timeout", "120")  # 2,048 tokens of tiny's KV
    try:
        for i in range(8):
            question = " ".join(f"Is item {i * 100 + j} on shelf {j}?" for j in range(15))  # ~200 tokens each
            _, served = chat(s, question)
            assert i == 0 or served >= 1472, (i, served)  # the shared blocks stayed
        c = cache(s)
        assert c["evictions"] > 0 and c["memory_bytes"] <= 1024**2
    finally:
        assert s.stop() == 0, s.log()[-3000:]


def test_kv_bits_8_holds_the_cache_in_at_most_055x_the_bytes_per_token(server):
    quantized = start_serve("builtin:tiny", "--kv-bits", "8", "--timeout", "120")
    try:
        plain_answer, _ = chat(server, "Where is item 3?")
        answer, _ = chat(quantized, "Where is item 3?")
        again, served = chat(quantized, "Where is item 3?")
        counts = ("prompt_tokens", "completion_tokens")
        assert served >= 1472 and [again["usage"][k] for k in counts] == [answer["usage"][k] for k in counts]
        assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": served}
        plain, small = cache(server), cache(quantized)
        assert small["kv_bits"] == 8 and plain["kv_bits"] is None
        assert plain["kv_bytes_per_token"] == 512  # builtin:tiny: 2 layers x 2 x 2 heads x 16 dims x 4 bytes
        assert small["kv_bytes_per_token"] <= 0.55 * plain["kv_bytes_per_token"], (small, plain)
        assert plain_answer["usage"]["prompt_tokens"] == answer["usage"]["prompt_tokens"]
    finally:
        assert quantized.stop() == 0, quantized.log()[-3000:]
