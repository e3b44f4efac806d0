"""The KV budget of running requests on a real worker (builtin:tiny, 512 bytes of KV a token) with
a budget that holds two requests' KV: eight long requests all complete, two at a time, the others
queued and shown waiting in /v1/status; one that could never fit is a 400 naming the numbers in
both API families, before any work; the worker's memory stays within the budget, the weights and
a stated margin."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.support.servers import start_serve
from vllmmlxd.config.speculative import SpeculativeConfig
from vllmmlxd.engine.step.kv_budget import PEAK_COPIES

PROMPT = "Once upon a time " * 10  # 41 tokens with builtin:tiny's tokenizer
PROMPT_TOKENS = 41
MAX_TOKENS = 120
# The positions mlx-lm's KV cache grows by, counted in each row, and the draft positions a
# verifying step writes before it trims (prompt lookup is on by default: num_draft 4).
GROWTH = 256 + SpeculativeConfig().num_draft
ROW = (PROMPT_TOKENS + MAX_TOKENS + GROWTH) * 512  # one such request's KV, as the batch holds it
BUDGET_MB = 0.5  # two rows (0.41 MB) fit, three (0.61 MB) do not
LARGEST = int(BUDGET_MB * 2**20) // 512 - GROWTH  # prompt + max_tokens one request may have: 764
EOS = 2
# What the worker holds besides the KV: the interpreter, FastAPI, MLX and the BLAS (a ready
# builtin:tiny worker measured 220-230 MB of RSS here), and its 12 MB of weights.
WORKER_MB, WEIGHTS_MB = 400, 13
# RSS the burst may add besides twice the KV budget (a batch copies its KV as rows join and
# leave: kv_budget.PEAK_COPIES): HTTP buffers, Python objects, the allocator's slack (measured:
# 10 MB on this Linux box).
BURST_MARGIN_MB = 48


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny", "--max-num-seqs", "8", "--max-kv-memory-mb", str(BUDGET_MB), "--timeout", "300")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def memory_mb(pid: int) -> dict[str, float]:
    """The process's resident memory now (VmRSS) and at most so far (VmHWM), in MB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


def status(server) -> dict:
    return httpx.get(server.url + "/v1/status", timeout=30).json()


def test_the_budget_is_read_from_the_model(server):
    kv = status(server)["kv_budget"]
    assert kv["budget_mb"] == BUDGET_MB and kv["source"] == f"max_kv_memory_mb {BUDGET_MB:g}"
    assert kv["bytes_per_token"] == 512 and kv["largest_request_tokens"] == LARGEST
    assert kv["running"] == 0 and kv["waiting"] == 0


def test_eight_long_requests_all_complete_two_at_a_time(server):
    if not Path(f"/proc/{server.proc.pid}/status").exists():
        pytest.skip("reads the worker's memory from /proc (Linux)")
    ready = memory_mb(server.proc.pid)
    body = {"prompt": PROMPT, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}
    polls: list[dict] = []
    peak_rss = [ready["VmRSS"]]

    async def watch(client: httpx.AsyncClient) -> None:
        while True:
            polls.append((await client.get(server.url + "/v1/status")).json())
            peak_rss.append(memory_mb(server.proc.pid)["VmRSS"])
            await asyncio.sleep(0.2)

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=300) as client:
            watcher = asyncio.create_task(watch(client))
            try:
                return await asyncio.gather(*(client.post(server.url + "/v1/completions", json=body) for _ in range(8)))
            finally:
                watcher.cancel()

    responses = asyncio.run(burst())
    assert [r.status_code for r in responses] == [200] * 8, [r.text for r in responses]  # queued, not failed
    assert all(r.json()["usage"]["completion_tokens"] == MAX_TOKENS for r in responses)
    assert len({r.json()["choices"][0]["text"] for r in responses}) == 1  # greedy: waiting changed nothing

    assert polls and all(p["num_running"] <= 2 for p in polls)
    waited = [p for p in polls if p["kv_budget"]["waiting"] > 0]
    assert waited, "no poll saw a request waiting for room in the KV budget"
    queued = [r for p in waited for r in p["requests"] if r["phase"] == "queued"]
    assert {r["waiting_for"] for r in queued} == {"kv_budget"}
    assert sorted({r["queue_position"] for r in queued})[:2] == [1, 2]
    for p in polls:  # what running requests reserve, and what the batch holds, stay within the budget
        kv = p["kv_budget"]
        assert kv["held_mb"] <= kv["reserved_mb"] <= BUDGET_MB

    after = status(server)["kv_budget"]
    assert after["running"] == 0 and after["waiting"] == 0 and after["reserved_mb"] == 0
    assert 0 < after["peak_held_mb"] <= BUDGET_MB
    worker = memory_mb(server.proc.pid)
    assert worker["VmHWM"] <= WEIGHTS_MB + PEAK_COPIES * BUDGET_MB + WORKER_MB, worker
    assert max(peak_rss) - ready["VmRSS"] <= PEAK_COPIES * BUDGET_MB + BURST_MARGIN_MB, (ready, max(peak_rss))
    print(f"kv admission: ready {ready}, peak sampled RSS {max(peak_rss):.1f} MB, after {worker}, {after}")


def test_a_request_that_can_never_fit_is_a_400_naming_the_numbers(server):
    before = status(server)["total_requests_processed"]
    asked = LARGEST - PROMPT_TOKENS + 1  # one token more than the budget holds for one request
    r = httpx.post(
        server.url + "/v1/completions", json={"prompt": PROMPT, "max_tokens": asked, "temperature": 0}, timeout=30
    )
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["code"] == "kv_budget_exceeded" and error["param"] == "max_tokens"
    assert f"{PROMPT_TOKENS} prompt + {asked:,} max_tokens tokens at 512 bytes a token" in error["message"]
    assert (
        f"KV budget is {BUDGET_MB:g} MB (max_kv_memory_mb {BUDGET_MB:g}), room for {LARGEST:,} tokens"
        in error["message"]
    )

    r = httpx.post(
        server.url + "/v1/messages",
        json={"model": "tiny", "max_tokens": LARGEST, "messages": [{"role": "user", "content": "hi"}]},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert f"{LARGEST:,} max_tokens tokens" in body["error"]["message"] and "KV budget" in body["error"]["message"]

    # One token less fits: served.
    ok = httpx.post(
        server.url + "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": asked - 1, "logit_bias": {str(EOS): 100}},
        timeout=60,
    )
    assert ok.status_code == 200, ok.text
    assert status(server)["total_requests_processed"] == before + 1  # the refused never reached the engine


def test_a_request_without_max_tokens_gets_what_the_budget_holds(server):
    # The entry's default (32768, lowered to the context's 2048) would not fit 0.7 MB: it is lowered
    # to what one request may have, not refused. EOS first, so it ends at once.
    r = httpx.post(
        server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "logit_bias": {str(EOS): 100}},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] == "stop"


@pytest.mark.slow
def test_a_real_models_memory_stays_within_twice_the_budget():
    """SmolLM2-135M (46,080 bytes of KV a token, float32 on a CPU): a budget of two requests' KV,
    four requests at once; the worker's RSS grows by at most twice the budget and a margin."""
    if not Path("/proc/self/status").exists():
        pytest.skip("reads the worker's memory from /proc (Linux)")
    per_token, prompt_tokens, max_tokens = 46_080, 53, 40
    row_mb = (prompt_tokens + max_tokens + GROWTH) * per_token / 2**20  # 15.3 MB
    budget_mb = 40.0  # two rows fit, three do not
    s = start_serve(
        "builtin:smollm2-135m-instruct",
        *("--max-num-seqs", "8", "--max-kv-memory-mb", str(budget_mb), "--cache-memory-mb", "0", "--timeout", "600"),
    )
    try:
        kv = httpx.get(s.url + "/v1/status", timeout=60).json()["kv_budget"]
        assert kv["bytes_per_token"] == per_token and 2 * row_mb <= budget_mb < 3 * row_mb
        ready = memory_mb(s.proc.pid)
        body = {
            "prompt": "Once upon a time there was a small village by the sea. " * 4,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0,
        }
        peak_rss = [ready["VmRSS"]]

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=600) as client:

                async def watch() -> None:
                    while True:
                        peak_rss.append(memory_mb(s.proc.pid)["VmRSS"])
                        await asyncio.sleep(0.1)

                watcher = asyncio.create_task(watch())
                try:
                    return await asyncio.gather(*(client.post(s.url + "/v1/completions", json=body) for _ in range(4)))
                finally:
                    watcher.cancel()

        responses = asyncio.run(burst())
        assert [r.status_code for r in responses] == [200] * 4, [r.text for r in responses]
        assert responses[0].json()["usage"]["prompt_tokens"] == prompt_tokens
        kv = httpx.get(s.url + "/v1/status", timeout=60).json()["kv_budget"]
        grown = max(peak_rss) - ready["VmRSS"]
        print(f"kv admission, SmolLM2: ready {ready}, RSS grew {grown:.1f} MB, {kv}")
        assert kv["peak_held_mb"] <= budget_mb
        assert grown <= PEAK_COPIES * budget_mb + BURST_MARGIN_MB, (ready, max(peak_rss))
    finally:
        assert s.stop() == 0, s.log()[-3000:]
