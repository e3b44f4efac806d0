"""Continuous batching and the prefix cache on a real worker: concurrent requests share
decode steps and each keeps its own sampling, stops and limits; a disconnect frees its slot;
prompts reuse the KV of earlier ones; the cache stays within its byte budget."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from tests.support.servers import start_serve

HELLO, WORLD = 19556, 2260  # "Hello" and " World" in builtin:tiny's (SmolLM2's) vocabulary
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny", "--max-num-seqs", "8", "--timeout", "120")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def status(server) -> dict:
    return httpx.get(server.url + "/v1/status").json()


async def complete_all(url: str, bodies: list[dict]) -> list[dict]:
    async with httpx.AsyncClient(timeout=120) as client:
        responses = await asyncio.gather(*(client.post(url + "/v1/completions", json=b) for b in bodies))
    assert [r.status_code for r in responses] == [200] * len(bodies), [r.text for r in responses]
    return [r.json() for r in responses]


def text(response: dict) -> str:
    return response["choices"][0]["text"]


def test_eight_concurrent_requests_each_get_what_they_asked_for(server):
    base = {"prompt": PROMPT, "ignore_eos": True, "max_tokens": 12}
    bodies = [
        {**base, "temperature": 0, "max_tokens": 5},  # 0: its own max_tokens
        {**base, "temperature": 1.0, "seed": 11},  # 1, 2: one seed, one text
        {**base, "temperature": 1.0, "seed": 11},
        {**base, "temperature": 1.0, "seed": 12},  # 3: another seed
        {**base, "temperature": 0, "logit_bias": {str(HELLO): 100}, "max_tokens": 6},  # 4: its own bias
        {**base, "temperature": 0, "logit_bias": {str(HELLO): 100}, "stop": ["loHel"]},  # 5: its own stop
        {**base, "temperature": 0, "logit_bias": {str(WORLD): 100}, "max_tokens": 4},  # 6: another bias
        {**base, "temperature": 2.0, "top_k": 1},  # 7: top_k 1 is greedy at any temperature
    ]
    before = status(server)
    got = asyncio.run(complete_all(server.url, bodies))
    after = status(server)

    assert got[0]["usage"]["completion_tokens"] == 5 and got[0]["choices"][0]["finish_reason"] == "length"
    assert text(got[1]) == text(got[2]) and text(got[1]) != text(got[3])
    assert text(got[4]) == "Hello" * 6
    assert text(got[5]) == "Hel" and got[5]["choices"][0]["finish_reason"] == "stop"
    assert text(got[6]) == " World" * 4
    assert text(got[7]) == text(got[0]) + text(got[7])[len(text(got[0])) :]  # greedy, like request 0
    # They shared decode steps: far fewer steps than tokens.
    tokens = after["total_completion_tokens"] - before["total_completion_tokens"]
    steps = after["steps_executed"] - before["steps_executed"]
    assert tokens == sum(r["usage"]["completion_tokens"] for r in got)
    assert steps < tokens / 2, (steps, tokens)


def test_a_seed_gives_the_same_text_alone_and_batched(server):
    seeded = {"prompt": PROMPT, "ignore_eos": True, "max_tokens": 10, "temperature": 0.9, "seed": 5}
    alone = text(httpx.post(server.url + "/v1/completions", json=seeded, timeout=60).json())
    others = [{**seeded, "seed": s, "prompt": f"Story number {s}"} for s in range(20, 27)]
    batched = asyncio.run(complete_all(server.url, [seeded, *others]))
    assert text(batched[0]) == alone


def test_a_resent_chat_history_reuses_the_cache(server):
    system = {"role": "system", "content": "You are a terse assistant. " * 30}
    history = [system, {"role": "user", "content": "Say hello."}]
    # The bias makes the answer a word whose text tokenizes back to the same ids.
    first = httpx.post(
        server.url + "/v1/chat/completions",
        timeout=60,
        json={"messages": history, "max_tokens": 6, "temperature": 0, "logit_bias": {str(HELLO): 100}},
    ).json()
    answer = first["choices"][0]["message"]["content"]
    assert answer == "Hello" * 6
    history += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Again, longer."}]
    seen: list[dict] = []

    def turn_two() -> None:
        body = {"messages": history, "max_tokens": 400, "temperature": 0, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and not seen:
                    seen.extend(status(server)["requests"])

    t = threading.Thread(target=turn_two)
    t.start()
    t.join(60)
    assert seen, "the second turn was never seen running"
    request = seen[0]
    assert request["cache_hit_type"] == "prefix"
    assert request["cached_tokens"] >= first["usage"]["prompt_tokens"] + 5
    assert status(server)["cache"]["hits"] >= 1


def test_two_concurrent_requests_share_a_long_system_prompt(server):
    shared = "Rules of the house: " + " ".join(f"rule{i}" for i in range(300))
    bodies = [{"prompt": shared + f" Question {q}:", "max_tokens": 4, "temperature": 0} for q in ("alpha", "omega")]
    before = status(server)["cache"]
    asyncio.run(complete_all(server.url, bodies))
    after = status(server)["cache"]
    # The second waited for the first's prefill and took the shared part from the cache.
    assert after["hits"] - before["hits"] >= 1
    assert after["cached_tokens"] - before["cached_tokens"] >= 300


def test_the_prefix_cache_never_exceeds_its_budget():
    s = start_serve("builtin:tiny", "--cache-memory-mb", "1")
    try:
        peak = 0.0
        for i in range(12):  # distinct prompts of ~500 tokens: ~250 KB of KV each in builtin:tiny
            prompt = f"Document {i}: " + " ".join(f"w{i}x{j}" for j in range(250))
            r = httpx.post(s.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2}, timeout=60)
            assert r.status_code == 200
            cache = status(s)["cache"]
            assert cache["budget_mb"] == 1.0
            assert cache["memory_mb"] <= cache["budget_mb"], cache
            peak = max(peak, cache["memory_mb"])
        assert cache["evictions"] > 0 and cache["entries"] >= 1 and peak > 0.5
    finally:
        assert s.stop() == 0


def test_a_disconnect_frees_its_slot_at_the_next_step():
    s = start_serve("builtin:tiny", "--max-num-seqs", "1")
    try:
        body = {"prompt": "x", "max_tokens": 1900, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert status(s)["num_running"] == 1
        # The one slot is free again as soon as the engine sees the disconnect...
        deadline = time.monotonic() + 10
        while status(s)["num_running"] or status(s)["requests"]:
            assert time.monotonic() < deadline, status(s)
            time.sleep(0.02)
        # ...so the next request runs at once instead of queueing behind 1,900 tokens.
        started = time.perf_counter()
        r = httpx.post(s.url + "/v1/completions", json={"prompt": "y", "max_tokens": 3}, timeout=60)
        assert r.status_code == 200 and time.perf_counter() - started < 5
    finally:
        assert s.stop() == 0
