from vllmmlxd.engine.types import EngineStats, RequestProgress


def test_progress_phases_and_rates():
    p = RequestProgress("r1", prompt_tokens=10, max_tokens=100, queued_at=0.0)
    assert p.snapshot(now=1.0)["phase"] == "queued" and p.snapshot(now=1.0)["queued_s"] == 1.0
    assert p.snapshot(now=1.0)["progress"] == 0.0
    p.started_at = 2.0
    assert p.snapshot(now=2.5)["phase"] == "prefill"
    p.first_token_at, p.generated_tokens = 3.0, 21
    snap = p.snapshot(now=5.0)
    assert snap["phase"] == "generation" and snap["ttft_s"] == 1.0
    assert snap["tokens_per_second"] == 10.0 and snap["progress"] == 0.21 and snap["queued_s"] == 2.0


def test_stats_list_active_requests_in_admission_order():
    stats = EngineStats()
    stats.requests["a"] = RequestProgress("a", 1, 5)
    stats.requests["b"] = RequestProgress("b", 1, 5)
    assert [r["request_id"] for r in stats.active_requests()] == ["a", "b"]


def test_progress_follows_the_prefill_then_the_generation():
    p = RequestProgress("r1", prompt_tokens=7000, max_tokens=100, queued_at=0.0)
    p.started_at, p.cached_tokens, p.prefilled_tokens = 1.0, 1000, 1000  # a cache hit starts it part way
    assert p.snapshot(now=2.0)["progress"] == 0.1429
    p.prefilled_tokens = 1004  # one small chunk still shows
    snap = p.snapshot(now=2.0)
    assert snap["progress"] == 0.1434 and snap["prefilled_tokens"] == 1004 and snap["phase"] == "prefill"
    p.prefilled_tokens, p.first_token_at, p.last_token_at, p.generated_tokens = 7000, 3.0, 3.0, 1
    assert p.snapshot(now=3.0)["progress"] == 0.01  # generating: of max_tokens
