"""Metrics: the engine collector's translation and the middleware on tiny inline apps."""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.responses import StreamingResponse
from starlette.testclient import TestClient

from vllmmlxd.engine.types import Engine, EngineStats
from vllmmlxd.http.metrics import Metrics, MetricsMiddleware

M = {"model": "m"}


class FakeEngine:
    """What the collector reads of an engine: stats, the prefix cache's block, MLX memory."""

    def __init__(self, stats: EngineStats | None = None):
        self.stats = stats or EngineStats()
        self.cache = {
            "type": "prefix_lru",
            "entries": 2,
            "hit_rate": 0.5,
            "memory_mb": 1.5,
            "budget_mb": 64.0,
            "hits": 3,
            "misses": 3,
            "cached_tokens": 120,
            "evictions": 1,
        }

    def cache_status(self) -> dict:
        return self.cache

    def memory(self) -> dict:
        return {"active_memory_gb": 0.5, "peak_memory_gb": 1.0, "cache_memory_gb": 0.25}


def sample(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {**M, **labels})


def test_the_collector_reads_engine_stats_at_scrape_time():
    stats = EngineStats(
        steps_executed=9,
        num_running=1,
        num_waiting=2,
        total_requests_processed=3,
        total_prompt_tokens=40,
        total_completion_tokens=50,
    )
    metrics = Metrics(FakeEngine(stats), "m")
    assert sample(metrics, "vllmmlxd_prompt_tokens_total") == 40
    assert sample(metrics, "vllmmlxd_completion_tokens_total") == 50
    assert sample(metrics, "vllmmlxd_requests_processed_total") == 3
    assert sample(metrics, "vllmmlxd_engine_steps_total") == 9
    assert sample(metrics, "vllmmlxd_requests_running") == 1
    assert sample(metrics, "vllmmlxd_requests_waiting") == 2
    stats.total_completion_tokens = 51
    stats.num_waiting = 0
    assert sample(metrics, "vllmmlxd_completion_tokens_total") == 51
    assert sample(metrics, "vllmmlxd_requests_waiting") == 0


def test_each_app_has_its_own_registry():
    a, b = Metrics(FakeEngine(), "m"), Metrics(FakeEngine(), "m")  # would clash in the global registry
    a.observe("/x", 200, 0.1)
    assert sample(a, "vllmmlxd_requests_total", route="/x", status="200") == 1
    assert sample(b, "vllmmlxd_requests_total", route="/x", status="200") is None


def make_app() -> tuple[FastAPI, Metrics]:
    app = FastAPI()
    metrics = Metrics(cast(Engine, FakeEngine()), "m")  # a stand-in: what the collector reads, no more
    app.add_middleware(MetricsMiddleware, metrics=metrics)

    @app.get("/items/{item_id}")
    async def item(item_id: int):
        return {"id": item_id}

    @app.get("/stream")
    async def stream():
        async def body():
            for part in ("a", "b", "c"):
                await asyncio.sleep(0.1)
                yield part

        return StreamingResponse(body())

    @app.get("/boom")
    async def boom():
        raise RuntimeError("boom")

    @app.get("/metrics")
    async def scrape():
        return metrics.response()

    return app, metrics


def test_requests_are_counted_by_route_template_and_status():
    app, metrics = make_app()
    client = TestClient(app, raise_server_exceptions=False)
    assert client.get("/items/1").status_code == 200
    assert client.get("/items/2").status_code == 200
    assert client.get("/items/x").status_code == 422
    assert client.get("/no/such/path/123").status_code == 404
    assert client.get("/boom").status_code == 500
    assert sample(metrics, "vllmmlxd_requests_total", route="/items/{item_id}", status="200") == 2
    assert sample(metrics, "vllmmlxd_requests_total", route="/items/{item_id}", status="422") == 1
    assert sample(metrics, "vllmmlxd_requests_total", route="other", status="404") == 1
    assert sample(metrics, "vllmmlxd_requests_total", route="/boom", status="500") == 1
    text = client.get("/metrics").text
    assert "/items/1" not in text and "/no/such" not in text


def test_a_stream_is_timed_until_its_last_byte():
    app, metrics = make_app()
    assert TestClient(app).get("/stream").text == "abc"
    assert sample(metrics, "vllmmlxd_request_duration_seconds_count", route="/stream") == 1
    assert sample(metrics, "vllmmlxd_request_duration_seconds_sum", route="/stream") >= 0.3


def test_the_scrape_is_prometheus_text():
    app, _ = make_app()
    r = TestClient(app).get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE_LATEST
    assert 'vllmmlxd_requests_waiting{model="m"} 0.0' in r.text
    assert "# TYPE vllmmlxd_request_duration_seconds histogram" in r.text


def test_latency_histograms_cache_and_memory_families():
    stats = EngineStats()
    for s in (0.03, 0.2, 4.0):
        stats.ttft.observe(s)
    for s in (0.004, 0.004, 0.03):
        stats.inter_token.observe(s)
    metrics = Metrics(FakeEngine(stats), "m")
    assert sample(metrics, "vllmmlxd_time_to_first_token_seconds_count") == 3
    assert sample(metrics, "vllmmlxd_time_to_first_token_seconds_bucket", le="0.25") == 2
    assert sample(metrics, "vllmmlxd_time_to_first_token_seconds_bucket", le="+Inf") == 3
    assert sample(metrics, "vllmmlxd_time_to_first_token_seconds_sum") == pytest.approx(4.23)
    assert sample(metrics, "vllmmlxd_inter_token_latency_seconds_bucket", le="0.005") == 2
    assert sample(metrics, "vllmmlxd_prefix_cache_hits_total") == 3
    assert sample(metrics, "vllmmlxd_prefix_cache_misses_total") == 3
    assert sample(metrics, "vllmmlxd_prefix_cache_bytes") == 1.5 * 1024**2
    assert sample(metrics, "vllmmlxd_prefix_cache_budget_bytes") == 64 * 1024**2
    assert sample(metrics, "vllmmlxd_mlx_peak_memory_bytes") == 1024**3


class ShardedEngine(FakeEngine):
    """Rank 0's engine of a distributed entry: it reports its ranks' last step and frame wait times."""

    def distributed_status(self) -> dict:
        return {
            "backend": "ring",
            "parallel": "pipeline",
            "world": 2,
            "frames": 17,
            "overflow_frames": 0,
            "ranks": [
                {"rank": 0, "host": "127.0.0.1", "pid": 10, "share": "layers 0-14 of 30", "step_ms": 12.5},
                {
                    "rank": 1,
                    "host": "127.0.0.1",
                    "pid": 11,
                    "share": "layers 15-29 of 30",
                    "step_ms": 11.0,
                    "wait_ms": 0.5,
                },
            ],
        }


def test_a_distributed_engine_exports_its_ranks_steps_and_waits():
    """The rank count, rank 0's frames, each rank's last step and each follower's frame wait, in seconds."""
    metrics = Metrics(ShardedEngine(), "m")
    assert sample(metrics, "vllmmlxd_distributed_ranks") == 2.0
    assert sample(metrics, "vllmmlxd_distributed_frames_total") == 17
    assert sample(metrics, "vllmmlxd_rank_step_seconds", rank="0") == pytest.approx(0.0125)
    assert sample(metrics, "vllmmlxd_rank_step_seconds", rank="1") == pytest.approx(0.011)
    assert sample(metrics, "vllmmlxd_rank_frame_wait_seconds", rank="1") == pytest.approx(0.0005)
    assert sample(metrics, "vllmmlxd_rank_frame_wait_seconds", rank="0") is None  # rank 0 waits for no frame
    text = metrics.response().body.decode()
    assert 'vllmmlxd_distributed_ranks{model="m"} 2.0' in text
    assert 'vllmmlxd_rank_step_seconds{model="m",rank="1"} 0.011' in text


class SingleEngine(FakeEngine):
    """The MLX engine of a single process: ``distributed_status()`` says None."""

    def distributed_status(self) -> None:
        return None


@pytest.mark.parametrize("engine", [FakeEngine, SingleEngine])
def test_a_single_process_engine_exports_no_rank_family(engine):
    """An engine without ``distributed_status`` (or one that says None) adds none of those families."""
    text = Metrics(engine(), "m").response().body.decode()
    assert "vllmmlxd_distributed" not in text and "vllmmlxd_rank_" not in text
    assert "vllmmlxd_requests_waiting" in text


class BudgetedEngine(FakeEngine):
    """An engine with a KV budget of running requests (``kv_status``)."""

    def kv_status(self) -> dict:
        return {"budget_mb": 8.0, "reserved_mb": 6.0, "held_mb": 2.5, "running": 2, "waiting": 3}


def test_the_kv_budget_and_who_waits_for_it():
    metrics = Metrics(BudgetedEngine(), "m")
    assert sample(metrics, "vllmmlxd_kv_budget_bytes") == 8 * 1024**2
    assert sample(metrics, "vllmmlxd_kv_reserved_bytes") == 6 * 1024**2
    assert sample(metrics, "vllmmlxd_kv_held_bytes") == 2.5 * 1024**2
    assert sample(metrics, "vllmmlxd_requests_waiting_for_kv") == 3
    assert "vllmmlxd_kv_" not in Metrics(FakeEngine(), "m").response().body.decode()  # no budget: no family
