"""`--rate-limit` and `--enable-metrics` on a real worker (`vllmmlxd serve builtin:tiny`)."""

from __future__ import annotations

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.servers import start_serve

KEY = "s3cret-key-for-metrics-tests"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODEL = "builtin:tiny"
SMALL = {"prompt": "x", "max_tokens": 3, "ignore_eos": True}


@pytest.fixture
def limited():
    """A worker with a key, 3 requests per minute and metrics; fresh per test (startup ~2 s)."""
    s = start_serve(MODEL, "--rate-limit", "3", "--enable-metrics", "--api-key", KEY)
    yield s
    assert s.stop() == 0, s.log()[-3000:]
    assert KEY not in s.log()


def scrape(server) -> dict[tuple[str, frozenset], float]:
    r = httpx.get(server.url + "/metrics")  # no key: /metrics is open, as the reference server's
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def value(samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset({"model": MODEL, **labels}.items())))


def assert_rate_limited(r: httpx.Response) -> None:
    assert r.status_code == 429
    assert 1 <= int(r.headers["retry-after"]) <= 60
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "per minute" in error["message"]
    assert (error["type"], error["param"], error["code"]) == ("rate_limit_error", None, "rate_limit_exceeded")


def test_a_key_gets_its_rate_then_429_while_health_and_metrics_stay_open(limited):
    url = limited.url + "/v1/completions"
    assert [httpx.post(url, json=SMALL, headers=AUTH).status_code for _ in range(3)] == [200, 200, 200]
    assert_rate_limited(httpx.post(url, json=SMALL, headers=AUTH))
    client = openai.OpenAI(base_url=limited.url + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.RateLimitError) as info:
        client.models.list()
    assert info.value.code == "rate_limit_exceeded" and info.value.response.headers["retry-after"]
    for _ in range(5):
        assert httpx.get(limited.url + "/health").status_code == 200
        assert httpx.get(limited.url + "/metrics").status_code == 200
    # Wrong keys spend the address's budget, not a fresh one per guessed key.
    assert [httpx.post(url, json=SMALL, headers={"x-api-key": f"guess-{i}"}).status_code for i in range(3)] == [401] * 3
    assert_rate_limited(httpx.post(url, json=SMALL, headers={"x-api-key": "guess-4"}))


def test_metrics_count_requests_tokens_and_the_queue(limited):
    client = openai.OpenAI(base_url=limited.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    client.completions.create(model="default", prompt="x", max_tokens=4)
    stream = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    assert list(stream)
    assert client.models.list().data[0].id == MODEL
    with pytest.raises(openai.RateLimitError):
        client.completions.create(model="default", prompt="x", max_tokens=4)

    m = scrape(limited)
    total = "vllmmlxd_requests_total"
    assert value(m, total, route="/v1/completions", status="200") == 1
    assert value(m, total, route="/v1/completions", status="429") == 1
    assert value(m, total, route="/v1/chat/completions", status="200") == 1
    assert value(m, total, route="/v1/models", status="200") == 1
    assert value(m, "vllmmlxd_request_duration_seconds_count", route="/v1/chat/completions") == 1
    assert value(m, "vllmmlxd_completion_tokens_total") >= 8
    assert value(m, "vllmmlxd_prompt_tokens_total") > 0
    assert value(m, "vllmmlxd_requests_waiting") == 0
    assert value(m, "vllmmlxd_requests_running") is not None
    assert value(m, "vllmmlxd_engine_steps_total") >= 8
    # Latency histograms, the prefix cache and MLX's memory, each a family of its own.
    assert value(m, "vllmmlxd_time_to_first_token_seconds_count") >= 2
    assert value(m, "vllmmlxd_time_to_first_token_seconds_bucket", le="+Inf") >= 2
    assert value(m, "vllmmlxd_inter_token_latency_seconds_count") >= 6
    assert value(m, "vllmmlxd_prefix_cache_hits_total") + value(m, "vllmmlxd_prefix_cache_misses_total") >= 2
    assert value(m, "vllmmlxd_prefix_cache_budget_bytes") > 0
    assert value(m, "vllmmlxd_prefix_cache_bytes") >= 0 and value(m, "vllmmlxd_prefix_cache_entries") >= 0
    assert value(m, "vllmmlxd_mlx_active_memory_bytes") > 0 and value(m, "vllmmlxd_mlx_peak_memory_bytes") > 0
    # Raw paths never become labels: an unknown path is counted as "other".
    assert httpx.get(limited.url + "/no/such/route/42").status_code == 404
    m = scrape(limited)
    assert value(m, total, route="other", status="404") == 1
    assert not any("/no/such" in str(labels) for _, labels in m)


def test_without_a_server_key_the_address_is_limited_and_metrics_are_off():
    s = start_serve(MODEL, "--rate-limit", "2")
    try:
        r = httpx.get(s.url + "/metrics")
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        # Clients' dummy keys do not matter on a keyless server: one address, one budget.
        for key in ("a", "b"):
            client = openai.OpenAI(base_url=s.url + "/v1", api_key=key, max_retries=0)
            assert client.models.list().data[0].id == MODEL
        assert_rate_limited(httpx.get(s.url + "/v1/status", headers={"Authorization": "Bearer c"}))
        assert httpx.get(s.url + "/health").status_code == 200
    finally:
        assert s.stop() == 0
