from vllmmlxd.engine.types import EngineStats, RequestProgress


def test_progress_phases_and_rates():
    p = RequestProgress("r1", prompt_tokens=10, max_tokens=100, queued_at=0.0)
    assert p.snapshot(now=1.0)["phase"] == "queued" and p.snapshot(now=1.0)["queued_s"] == 1.0
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
