"""Settings pushes: judged (pure), then applied by the private app, never reachable publicly."""

from __future__ import annotations

from typing import cast

import pytest
from starlette.requests import Request
from starlette.testclient import TestClient

from tests.support.servers import version_fields
from vllmmlxd.api.context import LiveContext
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.engine.types import Engine, EngineStats, ModelInfo
from vllmmlxd.worker.app import create_app, create_private_app
from vllmmlxd.worker.settings import SettingsRefused, judge_update

SECRET = "unit-s3cret"
BASE = ResolvedModel(model="builtin:tiny", api_key=SECRET, rate_limit=5)


class FakeEngine:
    """Enough of an engine for the apps' health, status and metrics."""

    def __init__(self):
        self.info = ModelInfo(name="m", context_length=128, vocab_size=100, source="builtin:tiny")
        self.stats = EngineStats()
        self.max_queue = 64

    def cache_status(self) -> dict:
        return {
            "type": "prefix_lru",
            "entries": 0,
            "hit_rate": 0.0,
            "memory_mb": 0.0,
            "budget_mb": 8.0,
            "hits": 0,
            "misses": 0,
            "cached_tokens": 0,
            "evictions": 0,
        }

    def memory(self) -> dict:
        return {"active_memory_gb": 0.0, "peak_memory_gb": 0.0, "cache_memory_gb": 0.0}


def entry(**changes) -> dict:
    data = {**BASE.model_dump(mode="json"), "api_key": SECRET}
    return {**data, **changes}


def test_only_live_keys_may_change():
    new, keys = judge_update(BASE, entry(timeout=3, max_queue=2, api_key="other"))
    assert keys == ("api_key", "max_queue", "timeout") and new.timeout == 3
    assert judge_update(BASE, entry()) == (BASE, ())
    with pytest.raises(SettingsRefused) as refused:
        judge_update(BASE, entry(model="builtin:smollm2-135m-instruct", timeout=3))
    assert refused.value.status == 409 and refused.value.forcing == ("model",)


def test_an_invalid_entry_is_422_naming_the_key_not_the_value():
    with pytest.raises(SettingsRefused) as refused:
        judge_update(BASE, entry(api_key=SECRET, timeout=-4, nonsense=SECRET))
    assert refused.value.status == 422
    assert "timeout" in refused.value.message and "nonsense" in refused.value.message
    assert SECRET not in refused.value.message
    with pytest.raises(SettingsRefused):
        judge_update(BASE, ["not", "an", "entry"])


def request() -> Request:
    return Request({"type": "http", "method": "GET", "path": "/", "headers": [], "client": ("1.2.3.4", 1), "state": {}})


def test_a_request_keeps_the_settings_it_started_with():
    live = LiveContext(FakeEngine(), BASE, "k")
    r = request()
    started = live.capture(r)
    live.swap(BASE.model_copy(update={"timeout": 1.0}))
    assert live.capture(r) is started and started.config.timeout == 300
    assert live.capture(request()).config.timeout == 1.0


def test_every_settings_generation_counts_in_the_workers_one_rate_store():
    live = LiveContext(FakeEngine(), BASE, "k")
    first = live.current
    second = live.swap(BASE.model_copy(update={"rate_limit": 7}))
    assert first.quotas.store is second.quotas.store is live.rates
    assert second.access is not first.access  # keys are re-read from the new entry


def apps(config: ResolvedModel = BASE):
    engine = FakeEngine()
    served = cast(Engine, engine)  # a stand-in: what the apps read of an engine, no more
    public = create_app(served, config, "k")
    # Host 127.0.0.1: the worker answers only under its own names (a DNS-rebinding defence).
    return engine, TestClient(public, base_url="http://127.0.0.1"), TestClient(create_private_app(public, served))


def test_the_private_app_applies_a_push_and_the_public_app_sees_it():
    engine, public, private = apps()
    auth = {"x-api-key": SECRET}
    assert private.get("/health").json()["config_hash"] == BASE.config_hash()
    assert public.get("/metrics").status_code == 404  # enable_metrics is off
    r = private.post("/internal/settings", json=entry(max_queue=3, owned_by="me", enable_metrics=True))
    new = BASE.model_copy(update={"max_queue": 3, "owned_by": "me", "enable_metrics": True})
    assert r.status_code == 200 and r.json() == {
        "ok": True,
        "config_hash": new.config_hash(),
        "changed": ["enable_metrics", "max_queue", "owned_by"],
    }
    assert engine.max_queue == 3
    assert public.get("/v1/models", headers=auth).json()["data"][0]["owned_by"] == "me"
    assert public.get("/metrics").status_code == 200
    assert private.get("/health").json()["config_hash"] == new.config_hash()
    r = private.post("/internal/settings", json=entry(port=9999))
    assert r.status_code == 409 and r.json()["forcing"] == ["port"]
    assert public.post("/internal/settings", json=entry(), headers=auth).status_code == 404


def test_health_is_degraded_503_while_work_waits_on_a_silent_engine(monkeypatch):
    monkeypatch.setenv("VLLMMLXD_STUCK_AFTER_S", "5")
    engine, public, private = apps()
    assert public.get("/health").json() == {"status": "ok", "model": "k", **version_fields()}
    engine.stats.num_waiting = 1
    engine.stats.last_step_at -= 60
    for client in (public, private):
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "degraded" and r.json()["stalled_s"] >= 60


class BudgetedEngine(FakeEngine):
    """An engine with a KV budget of running requests: it records what a push asks of it."""

    def __init__(self):
        super().__init__()
        self.kv_asked: list[float | None] = []

    def set_kv_budget(self, mb: float | None) -> None:
        self.kv_asked.append(mb)

    def kv_status(self) -> dict:
        return {"budget_mb": 1.0, "reserved_mb": 0.5, "held_mb": 0.25, "running": 1, "waiting": 2}


def test_a_push_hands_the_kv_budget_to_the_engine_and_health_shows_it():
    engine = BudgetedEngine()
    public = create_app(engine, BASE, "k")
    private = TestClient(create_private_app(public, engine))
    r = private.post("/internal/settings", json=entry(max_kv_memory_mb=256))
    assert r.status_code == 200 and r.json()["changed"] == ["max_kv_memory_mb"]  # live: no new worker
    assert engine.kv_asked == [256.0]
    private.post("/internal/settings", json=entry())  # unset again: back to the engine's default
    assert engine.kv_asked == [256.0, None]
    load = private.get("/health").json()["load"]
    assert load["kv"] == {"budget_mb": 1.0, "reserved_mb": 0.5, "held_mb": 0.25, "running": 1, "waiting": 2}
    status = TestClient(public, base_url="http://127.0.0.1").get("/v1/status", headers={"x-api-key": SECRET})
    assert status.json()["kv_budget"]["waiting"] == 2
