"""supervisor/memory.py: the memory plan (does a config fit; swap or restart a changed entry)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllmmlxd.config.schema import Config, ModelConfig
from vllmmlxd.runtime import memory as machine
from vllmmlxd.runtime.memory import MachineMemory
from vllmmlxd.store.weights import BUILTIN_PARAMETERS, WeightsEstimate
from vllmmlxd.supervisor.memory import (
    WORKER_OVERHEAD_MB,
    Capacity,
    Footprint,
    cache_budget,
    load_memory_plan,
    make_footprint,
    model_kind,
    plan_memory,
)

GIB = 1024  # in MB


def fp(weights: int, cache: int = 0, known: bool = True) -> Footprint:
    return Footprint(
        weights_mb=weights,
        cache_mb=cache,
        weights_known=known,
        weights_note="m: safetensors",
        cache_note="cache_memory_mb",
    )


def test_a_config_that_fits():
    plan = plan_memory(Capacity(16 * GIB, 2 * GIB, source="MemTotal"), {"a": fp(4000, 1000), "b": fp(1000)})
    assert plan.fits
    assert plan.needed_mb == 4000 + 1000 + 1000 + 2 * WORKER_OVERHEAD_MB
    assert plan.capacity.usable_mb == 14 * GIB
    text = plan.render()
    assert text.splitlines()[0] == (
        "memory: 6,400 MB needed, 14,336 MB usable (16,384 MB physical (MemTotal) - 2,048 MB reserve): fits"
    )
    assert (
        "  a: 5,200 MB = 4,000 MB weights (m: safetensors) + 1,000 MB cache (cache_memory_mb) + 200 MB worker" in text
    )


def test_a_config_that_does_not_fit_names_each_entry_with_its_numbers():
    plan = plan_memory(Capacity(16 * GIB, 2 * GIB, source="MemTotal"), {"small": fp(100), "big": fp(8000, 8000)})
    assert not plan.fits
    assert "does not fit" in plan.render().splitlines()[0]
    lines = plan.refusal().splitlines()
    assert lines[0] == (
        "not enough memory: the models need 16,500 MB, "
        "14,336 MB usable (16,384 MB physical (MemTotal) - 2,048 MB reserve)"
    )
    # The biggest first: the likeliest to change.
    assert lines[1].startswith("  big: 16,200 MB = 8,000 MB weights") and lines[2].startswith("  small: 300 MB")
    assert "cache_memory_mb" in lines[-1] and "memory_reserve_mb" in lines[-1]


def test_exactly_full_fits():
    plan = plan_memory(Capacity(1000, 0), {"a": fp(1000 - WORKER_OVERHEAD_MB)})
    assert plan.fits and plan.needed_mb == 1000


def test_the_working_set_caps_what_is_usable():
    capacity = Capacity(32 * GIB, 2 * GIB, working_set_mb=21 * GIB, source="hw.memsize")
    assert capacity.usable_mb == 21 * GIB
    assert "at most MLX's 21,504 MB working set" in capacity.render()
    assert Capacity(32 * GIB, 2 * GIB, working_set_mb=31 * GIB).usable_mb == 30 * GIB


def test_a_reserve_above_physical_leaves_nothing():
    assert Capacity(1000, 5000).usable_mb == 0
    assert not plan_memory(Capacity(1000, 5000), {"a": fp(1)}).fits


def test_unknown_physical_memory_is_not_checked():
    plan = plan_memory(Capacity(None, 2 * GIB), {"a": fp(10**9)}, {"a": fp(10**9)})
    assert plan.fits and plan.swap("a")
    assert "physical memory unknown: not checked" in plan.render()


def test_unknown_weights_count_as_zero_and_say_so():
    plan = plan_memory(Capacity(16 * GIB, 2 * GIB), {"hub": fp(0, 100, known=False)})
    assert plan.needed_mb == 100 + WORKER_OVERHEAD_MB
    assert "hub: 300 MB = ? MB weights (m: safetensors; unknown, counted as 0)" in plan.render()


def test_a_changed_entry_swaps_when_old_and_new_fit_together():
    plan = plan_memory(Capacity(10_000, 0), {"a": fp(3000), "b": fp(1000)}, {"a": fp(2800)})
    assert plan.fits and plan.swap("a") and plan.swap("b")  # b is not changing
    assert plan.changes["a"].peak_mb == 3200 + 1200 + 3000
    assert "  a, changed: swap (old and new worker at once: 7,400 MB of 10,000 MB)" in plan.render()


def test_a_changed_entry_restarts_when_old_and_new_do_not_fit_together():
    plan = plan_memory(Capacity(6000, 0), {"a": fp(3000), "b": fp(1000)}, {"a": fp(2800)})
    assert plan.fits and not plan.swap("a")
    assert (
        "  a, changed: restart: not enough memory for both (old and new worker at once would need 7,400 MB of 6,000 MB)"
    ) in plan.render()


def test_swaps_share_the_room_left_in_order():
    # 4,000 MB free beside the new set: a's old worker (2,200) fits, then b's (2,200) no longer does, c's (1,200) does.
    entries = {"a": fp(2000), "b": fp(2000), "c": fp(1000), "d": fp(800)}
    plan = plan_memory(Capacity(6600 + 4000, 0), entries, {"a": fp(2000), "b": fp(2000), "c": fp(1000)})
    assert plan.needed_mb == 6600
    assert [plan.swap(n) for n in "abc"] == [True, False, True]
    assert [plan.changes[n].peak_mb for n in "abc"] == [8800, 11000, 10000]


def test_a_refused_plan_does_not_describe_swaps():
    plan = plan_memory(Capacity(1000, 0), {"a": fp(5000)}, {"a": fp(5000)})
    assert not plan.fits and "changed" not in plan.render()


def test_the_cache_budget_comes_from_mb_else_from_a_share_of_physical():
    assert cache_budget(ModelConfig(model="x", cache_memory_mb=512), 16 * GIB) == (512, "cache_memory_mb")
    assert cache_budget(ModelConfig(model="x", cache_memory_mb=0), 16 * GIB) == (0, "cache_memory_mb")
    assert cache_budget(ModelConfig(model="x"), 10_000) == (2000, "20% of physical")
    assert cache_budget(ModelConfig(model="x", cache_memory_percent=0.125), 8000) == (1000, "12.5% of physical")
    assert cache_budget(ModelConfig(model="x"), None)[0] == 0


def test_a_footprint_rounds_weights_up_to_whole_mb():
    entry = ModelConfig(model="builtin:tiny", cache_memory_mb=64)
    f = make_footprint(entry, WeightsEstimate(12_881_208, "safetensors"), 16 * GIB)
    assert (f.weights_mb, f.cache_mb, f.worker_mb, f.total_mb) == (
        13,
        64,
        WORKER_OVERHEAD_MB,
        13 + 64 + WORKER_OVERHEAD_MB,
    )
    assert f.weights_note == "builtin:tiny: safetensors" and f.weights_known
    unknown = make_footprint(entry, WeightsEstimate(None, "not downloaded yet"), 16 * GIB)
    assert unknown.weights_mb == 0 and not unknown.weights_known


def test_a_running_kv_budget_counts_twice_only_when_set():
    # A batch copies its KV as rows join and leave: a worker's KV peaks at twice its budget.
    entry = ModelConfig(model="builtin:tiny", cache_memory_mb=64, max_kv_memory_mb=100.5)
    f = make_footprint(entry, WeightsEstimate(12_881_208, "safetensors"), 16 * GIB)
    assert f.kv_mb == 201 and f.total_mb == 13 + 64 + 201 + WORKER_OVERHEAD_MB
    assert "+ 201 MB running KV (2 x max_kv_memory_mb) + 200 MB worker" in f.render()
    default = make_footprint(ModelConfig(model="builtin:tiny", cache_memory_mb=64), WeightsEstimate(1, "x"), 16 * GIB)
    assert default.kv_mb == 0 and "running KV" not in default.render()  # the worker takes what is left


def test_the_daemons_kv_copies_are_the_engines():
    from vllmmlxd.engine.step.kv_budget import PEAK_COPIES
    from vllmmlxd.supervisor.memory import KV_PEAK_COPIES

    assert KV_PEAK_COPIES == PEAK_COPIES


@pytest.fixture
def sixteen_gib(monkeypatch):
    monkeypatch.setattr(machine, "read_machine_memory", lambda: MachineMemory(16 << 30, "MemTotal"))


def test_load_memory_plan_reads_this_config_on_a_given_machine(sixteen_gib, tmp_path: Path):
    config = Config.model_validate(
        {
            "daemon": {"memory_reserve_mb": 1024},
            "models": {
                "a": {"model": "builtin:tiny", "port": 8001, "cache_memory_mb": 100},
                "b": {"model": "builtin:tiny", "port": 8002, "cache_memory_mb": 100, "default_temperature": 0.1},
            },
        }
    )
    running_b = config.models["b"].model_copy(update={"default_temperature": 0.2})
    assert isinstance(running_b, ModelConfig)
    plan = load_memory_plan(config, tmp_path, {"b": running_b})
    assert plan.capacity == Capacity(16 * GIB, 1024, None, "MemTotal")
    tiny = -(-BUILTIN_PARAMETERS["tiny"][0] * 4 // machine.MIB)  # not converted in tmp_path: the constant
    assert plan.entries["a"].weights_mb == tiny and plan.entries["a"].total_mb == tiny + 100 + WORKER_OVERHEAD_MB
    assert plan.swap("b") and plan.changes["b"].peak_mb == 3 * plan.entries["a"].total_mb


@pytest.mark.parametrize(
    ("spec", "task", "config", "kind"),
    [
        ("builtin:tiny", "auto", None, "generate"),
        ("builtin:all-minilm-l6-v2", "auto", None, "embedding"),
        ("builtin:tiny-reranker", "auto", None, "rerank"),
        ("builtin:tiny-whisper", "auto", None, "speech"),
        ("/m/qwen3-reranker", "rerank", {"model_type": "qwen3"}, "rerank"),
        ("/m/qwen3", "auto", {"model_type": "qwen3"}, "generate"),
        ("/m/whisper", "auto", {"model_type": "whisper"}, "speech"),
        ("/m/minilm", "auto", {"model_type": "bert", "architectures": ["BertModel"]}, "embedding"),
        ("/m/ms-marco", "auto", {"model_type": "bert", "architectures": ["BertForSequenceClassification"]}, "rerank"),
        ("org/not-pulled", "auto", None, "generate"),
    ],
)
def test_what_an_entry_serves_decides_whether_it_holds_a_prefix_cache(spec, task, config, kind):
    assert model_kind(spec, task, config) == kind
    entry = ModelConfig(model="builtin:tiny", cache_memory_mb=512)
    f = make_footprint(entry, WeightsEstimate(1 << 20, "x"), 16 * GIB, kind)
    assert (f.cache_mb, f.cache_note) == (
        (512, "cache_memory_mb") if kind == "generate" else (0, f"none: a {kind} model")
    )


def test_a_speech_entry_is_planned_without_the_default_cache_share(sixteen_gib, tmp_path: Path):
    config = Config.model_validate({"models": {"ears": {"model": "builtin:tiny-whisper", "port": 8001}}})
    plan = load_memory_plan(config, tmp_path, {})
    assert plan.entries["ears"].cache_mb == 0  # its default cache_memory_percent would have held 10%
