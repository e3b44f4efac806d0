"""The liveness decision: a pure function of the engine's stats and the clock."""

from __future__ import annotations

from vllmmlxd.engine.types import EngineStats
from vllmmlxd.worker.liveness import DEFAULT_STUCK_AFTER_S, engine_health, stuck_after_s


def stats(running: int = 0, waiting: int = 0, last_step_at: float = 100.0) -> EngineStats:
    return EngineStats(num_running=running, num_waiting=waiting, last_step_at=last_step_at)


def test_an_idle_engine_is_ok_however_long_ago_it_stepped():
    assert engine_health(stats(), now=10_000.0, stuck_after=30) == ("ok", None)


def test_work_with_recent_steps_is_ok():
    assert engine_health(stats(running=3), now=129.0, stuck_after=30) == ("ok", None)
    assert engine_health(stats(waiting=1), now=130.0, stuck_after=30) == ("ok", None)


def test_work_waiting_on_a_silent_engine_is_degraded_with_how_long():
    assert engine_health(stats(running=1), now=131.25, stuck_after=30) == ("degraded", 31.2)
    assert engine_health(stats(waiting=2), now=200.0, stuck_after=30) == ("degraded", 100.0)


def test_a_request_admitted_but_not_yet_counted_running_is_work_too():
    s = stats()
    s.requests["r1"] = object()  # admitted; the first step has not posted num_running yet
    assert engine_health(s, now=200.0, stuck_after=30) == ("degraded", 100.0)


def test_the_threshold_comes_from_the_environment_when_it_is_a_positive_number():
    assert stuck_after_s({"VLLMMLXD_STUCK_AFTER_S": "2.5"}) == 2.5
    for bad in ("", "0", "-1", "soon"):
        assert stuck_after_s({"VLLMMLXD_STUCK_AFTER_S": bad}) == DEFAULT_STUCK_AFTER_S
    assert stuck_after_s({}) == DEFAULT_STUCK_AFTER_S
