"""kv_probe.py: a model's KV layout, read from the caches its own forward graph fills (never
evaluated); and the engine's budget made from it (status, refusals, live changes)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx import nn
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

from tests.unit.engine.scheduler_fakes import KV_BYTES_PER_TOKEN, CountingModel, FakeClock
from vllmmlxd.engine.loading.loader import load_model
from vllmmlxd.engine.mlx_engine import MLXEngine
from vllmmlxd.engine.step.kv_budget import LayerKv
from vllmmlxd.engine.step.kv_probe import probe_layout
from vllmmlxd.engine.types import GenerationRequest, SamplingParams
from vllmmlxd.errors import KvBudgetExceeded


class MixedModel(nn.Module):
    """One layer of each kind a family may have: plain attention (4 heads x 8, float16), a sliding
    window of 32 tokens, a recurrent state, and a layer of two caches (a latent KV and a window)."""

    def __init__(self) -> None:
        super().__init__()
        self.evaluated = False

    def make_cache(self):
        return [KVCache(), RotatingKVCache(max_size=32), ArraysCache(2), CacheList(KVCache(), KVCache())]

    def __call__(self, inputs: mx.array, cache: list) -> mx.array:
        kv = mx.zeros((1, 4, inputs.shape[1], 8), mx.float16)
        cache[0].update_and_fetch(kv, kv)
        cache[1].update_and_fetch(kv, kv)
        cache[2][0], cache[2][1] = mx.zeros((1, 3, 64), mx.float32), mx.zeros((1, 16, 16), mx.float32)
        latent = mx.zeros((1, 1, inputs.shape[1], 32), mx.bfloat16)
        cache[3][0].update_and_fetch(latent, latent)
        cache[3][1].update_and_fetch(kv, kv)
        return mx.zeros((1, inputs.shape[1], 10))


def test_each_kind_of_layer_is_read_from_its_cache():
    layout = probe_layout(MixedModel())
    per_head_token = 4 * 8 * 2 * 2  # heads x dim x float16 x (keys, values)
    assert layout.layers == (
        LayerKv(per_head_token),
        LayerKv(per_head_token, cap=32),
        LayerKv(0, fixed=(3 * 64 + 16 * 16) * 4),
        LayerKv(32 * 2 * 2 + per_head_token),
    )


def test_the_counting_model_and_builtin_tiny(state_dir):
    assert probe_layout(CountingModel(FakeClock())).per_token == KV_BYTES_PER_TOKEN
    tiny = load_model("builtin:tiny", state_dir)
    # 2 layers x 2 KV heads x a head dim of 16 x (keys, values) x float32.
    assert probe_layout(tiny.model).per_token == 2 * 2 * 16 * 2 * 4 == 512


def test_a_probe_runs_nothing(state_dir):
    clock = FakeClock()
    model = CountingModel(clock)
    seen = []
    model.on_call = lambda rows, tokens: seen.append(mx.array(0))  # anything the call makes stays a graph
    before = mx.get_active_memory()
    probe_layout(model)
    assert len(seen) == 1 and mx.get_active_memory() - before < 4096


def test_the_engine_reports_its_budget(state_dir):
    from vllmmlxd.engine.options import EngineOptions

    engine = MLXEngine(load_model("builtin:tiny", state_dir), options=EngineOptions(kv_budget_bytes=1 << 20))
    try:
        status = engine.kv_status()
        assert status["budget_mb"] == 1.0 and status["bytes_per_token"] == 512
        assert status["largest_request_tokens"] == 2048 - 256 == engine.kv_room()
        assert status["running"] == 0 and status["waiting"] == 0
        # One that could never fit is refused before it queues (a 400), naming what is too long.
        for prompt, max_tokens, param in ((100, 2000, "max_tokens"), (1900, 1, "messages")):
            request = GenerationRequest([5] * prompt, SamplingParams(max_tokens=max_tokens))
            with pytest.raises(KvBudgetExceeded) as refused:
                engine.generate(request)
            assert refused.value.status_code == 400 and refused.value.param == param
            assert f"{prompt:,} prompt + {max_tokens:,} max_tokens tokens" in refused.value.message
        assert not engine.stats.requests
        engine.set_kv_budget(2.0)  # a live change: swapped whole
        assert engine.kv_status()["budget_mb"] == 2.0 and engine.kv_room() == 4096 - 256
        engine.set_kv_budget(None)  # back to the default: the machine's memory is unknown here
        assert engine.kv_status()["budget_mb"] is None and engine.kv_room() is None
    finally:
        engine.close()
