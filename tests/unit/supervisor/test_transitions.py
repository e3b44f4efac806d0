"""transitions.decide over every (phase, event) pair: the next phase, the actions, or a refusal."""

from __future__ import annotations

import itertools

import pytest

from vllmmlxd.supervisor import states
from vllmmlxd.supervisor.slot.backoff import BackoffPolicy
from vllmmlxd.supervisor.slot.transitions import (
    EVENTS,
    PHASES,
    SWAPPING,
    UNLOADED,
    Counters,
    Event,
    EventKind,
    decide,
    public_state,
)

POLICY = BackoffPolicy(initial_s=0.5, factor=2, max_s=30, fast_crash_s=10, max_fast_crashes=3)
S, R, D, B, F, X, W = (
    states.STARTING,
    states.READY,
    states.DRAINING,
    states.BACKOFF,
    states.FAILED,
    states.STOPPED,
    SWAPPING,
)
U = UNLOADED

# (phase, event kind) → (next phase, actions, outcome); absent pairs are illegal (refused).
# Exits here are crashes of a worker that was ready briefly (exit code 1); other cases are below.
TABLE: dict[tuple[str, str], tuple[str, tuple[str, ...], str | None]] = {
    (X, "start"): (S, ("spawn",), None),
    (F, "start"): (S, ("spawn",), None),
    (B, "start"): (S, ("cancel_backoff", "spawn"), None),
    (S, "start"): (S, (), None),
    (R, "start"): (R, (), "ready"),
    (W, "start"): (W, (), None),
    (D, "start"): (D, (), None),
    (X, "stop"): (X, (), "stopped"),
    (F, "stop"): (X, (), "stopped"),
    (B, "stop"): (X, ("cancel_backoff",), "stopped"),
    (S, "stop"): (D, ("kill",), None),
    (R, "stop"): (D, ("drain",), None),
    (W, "stop"): (D, ("kill", "release_held"), None),
    (D, "stop"): (D, (), None),
    (X, "restart"): (S, ("spawn",), None),
    (F, "restart"): (S, ("spawn",), None),
    (B, "restart"): (S, ("cancel_backoff", "spawn"), None),
    (S, "restart"): (D, ("kill",), None),
    (R, "restart"): (W, ("hold_and_spawn",), None),
    (X, "replace"): (S, ("adopt", "spawn"), None),
    (F, "replace"): (S, ("adopt", "spawn"), None),
    (B, "replace"): (S, ("cancel_backoff", "adopt", "spawn"), None),
    (S, "replace"): (D, ("adopt", "kill"), None),
    (R, "replace"): (W, ("adopt", "hold_and_spawn"), None),
    (X, "apply_settings"): (X, ("adopt",), None),
    (F, "apply_settings"): (F, ("adopt",), None),
    (B, "apply_settings"): (B, ("adopt",), None),
    (S, "apply_settings"): (D, ("adopt", "kill"), None),
    (R, "apply_settings"): (R, ("adopt", "push_settings"), None),
    (X, "shutdown"): (X, (), "stopped"),
    (F, "shutdown"): (X, (), "stopped"),
    (B, "shutdown"): (X, ("cancel_backoff",), "stopped"),
    (S, "shutdown"): (D, ("kill",), None),
    (R, "shutdown"): (D, ("drain",), None),
    (W, "shutdown"): (D, ("kill", "release_held"), None),
    (D, "shutdown"): (D, (), None),
    (S, "worker_ready"): (R, (), "ready"),
    (W, "worker_ready"): (R, ("release_held",), "ready"),
    (S, "worker_exited"): (B, ("schedule_backoff",), "crashed"),
    (R, "worker_exited"): (B, ("schedule_backoff",), "crashed"),
    (W, "worker_exited"): (R, ("restore_held",), "restored"),
    (D, "worker_exited"): (X, (), "stopped"),
    (W, "held_exited"): (S, (), None),
    (R, "health_failed"): (R, ("kill",), None),
    (S, "start_timeout"): (S, ("kill",), None),
    (W, "start_timeout"): (W, ("kill",), None),
    (B, "backoff_elapsed"): (S, ("spawn",), None),
    (D, "apply_settings"): (D, ("adopt",), None),  # the worker that starts after the drain takes them
    # A lazy model: unloaded is where an unload ends and a load starts from; stopped (on purpose) refuses a load.
    (U, "start"): (S, ("spawn",), None),
    (U, "restart"): (S, ("spawn",), None),
    (U, "load"): (S, ("spawn",), None),
    (U, "replace"): (U, ("adopt",), "kept"),
    (U, "apply_settings"): (U, ("adopt",), None),
    (U, "stop"): (X, (), "stopped"),
    (U, "shutdown"): (X, (), "stopped"),
    (U, "unload"): (U, (), "stopped"),
    (S, "load"): (S, (), None),
    (R, "load"): (R, (), "ready"),
    (W, "load"): (W, (), None),
    (B, "load"): (S, ("cancel_backoff", "spawn"), None),
    (R, "unload"): (D, ("drain",), None),
    (S, "unload"): (D, ("kill",), None),
    (B, "unload"): (U, ("cancel_backoff",), "stopped"),
}


def event(kind: EventKind) -> Event:
    return Event(kind, code=1, ready_for_s=1.0) if kind in ("worker_exited", "held_exited") else Event(kind)


@pytest.mark.parametrize("phase,kind", list(itertools.product(PHASES, EVENTS)))
def test_every_pair(phase, kind):
    before = Counters(fast_crashes=1, restarts=2)
    d = decide(phase, event(kind), before, POLICY)
    expected = TABLE.get((phase, kind))
    if expected is None:
        assert d.error and kind in d.error and phase in d.error
        assert (d.phase, d.actions, d.counters, d.outcome) == (phase, (), before, None)
        return
    assert d.error is None
    assert (d.phase, d.actions, d.outcome) == expected
    # Only a spawn leads to starting/swapping from an idle phase, and a spawned worker is never started twice.
    assert d.actions.count("spawn") + d.actions.count("hold_and_spawn") <= 1


def test_the_table_names_only_real_phases_and_events():
    assert {p for p, _ in TABLE} <= set(PHASES) and {k for _, k in TABLE} <= set(EVENTS)


def test_a_swap_looks_ready_from_outside():
    assert public_state(SWAPPING) == states.READY
    assert [public_state(p) for p in states.ALL] == list(states.ALL)


def test_a_stop_interrupts_a_start_and_a_start_waits_for_the_drain():
    d = decide(S, Event("stop"), Counters(), POLICY)
    assert (d.phase, d.actions) == (D, ("kill",))
    d = decide(D, Event("start"), d.counters, POLICY)
    assert d.counters.then_start and d.phase == D
    d = decide(D, Event("worker_exited", code=-9), d.counters, POLICY)
    assert (d.phase, d.actions, d.outcome) == (S, ("spawn",), "gone") and not d.counters.then_start
    # ...and a stop after the start cancels it again.
    c = decide(D, Event("start"), Counters(), POLICY).counters
    c = decide(D, Event("stop"), c, POLICY).counters
    assert decide(D, Event("worker_exited", code=0), c, POLICY).phase == X


def test_an_unload_ends_unloaded_and_a_load_meanwhile_starts_again():
    d = decide(R, Event("unload"), Counters(), POLICY)
    assert d.counters.then_unload
    done = decide(D, Event("worker_exited", code=0), d.counters, POLICY)
    assert (done.phase, done.outcome) == (U, "stopped")
    again = decide(D, Event("load"), d.counters, POLICY)
    assert again.counters.then_start and not again.counters.then_unload
    assert decide(D, Event("worker_exited", code=0), again.counters, POLICY).actions == ("spawn",)


def test_a_load_never_starts_a_model_stopped_on_purpose():
    for phase in (X, F):
        assert "load while" in (decide(phase, Event("load"), Counters(), POLICY).error or "")
    stopping = decide(R, Event("stop"), Counters(), POLICY).counters
    assert decide(D, Event("load"), stopping, POLICY).error
    assert decide(X, Event("start"), Counters(), POLICY).actions == ("spawn",)  # a start does


def test_a_cold_replace_drains_then_starts():
    d = decide(R, Event("replace", hold_both=False), Counters(), POLICY)
    assert (d.phase, d.actions) == (D, ("adopt", "drain")) and d.counters.then_start
    d = decide(D, Event("worker_exited", code=0), d.counters, POLICY)
    assert (d.phase, d.actions) == (S, ("spawn",))


def test_restart_counts_and_cold_restart_drains():
    d = decide(R, Event("restart", hold_both=False), Counters(restarts=1), POLICY)
    assert (d.phase, d.actions, d.counters.restarts) == (D, ("drain",), 2)
    assert decide(B, Event("backoff_elapsed"), Counters(restarts=1), POLICY).counters.restarts == 2


def test_crashes_are_measured_from_ready_and_back_off_exponentially():
    c = Counters()
    delays = []
    for _ in range(2):  # never ready: each is a fast crash
        d = decide(S, Event("worker_exited", code=1, ready_for_s=None), c, POLICY)
        assert d.phase == B
        delays.append(d.delay)
        c = d.counters
    assert delays == [0.5, 1.0] and c.fast_crashes == 2
    d = decide(S, Event("worker_exited", code=1, ready_for_s=None), c, POLICY)
    assert (d.phase, d.outcome, d.actions) == (F, "failed", ()) and "3 times" in d.reason


def test_a_long_run_after_ready_resets_the_crash_count():
    d = decide(R, Event("worker_exited", code=-9, ready_for_s=3600.0), Counters(fast_crashes=2), POLICY)
    assert (d.phase, d.counters.fast_crashes, d.delay) == (B, 1, 0.5)


def test_a_short_run_after_a_long_load_is_still_fast():
    # ready_for_s counts from READY: a worker that loaded for ten minutes and died a second later
    d = decide(R, Event("worker_exited", code=1, ready_for_s=1.0), Counters(fast_crashes=2), POLICY)
    assert d.phase == F


def test_a_load_failure_fails_at_once():
    d = decide(S, Event("worker_exited", code=states.EXIT_LOAD_FAILED), Counters(), POLICY)
    assert (d.phase, d.outcome, d.actions) == (F, "failed", ()) and "could not be loaded" in d.reason


def test_a_failed_new_worker_restores_the_held_one_whatever_its_code():
    for code in (1, states.EXIT_LOAD_FAILED, -9, None):
        d = decide(W, Event("worker_exited", code=code), Counters(), POLICY)
        assert (d.phase, d.actions, d.outcome) == (R, ("restore_held",), "restored")


def test_a_draining_worker_exit_is_never_a_crash():
    d = decide(D, Event("worker_exited", code=-9), Counters(fast_crashes=2), POLICY)
    assert (d.phase, d.counters.fast_crashes) == (X, 2)


def test_after_shutdown_nothing_starts():
    c = decide(R, Event("shutdown"), Counters(), POLICY).counters
    assert c.closing
    for kind in ("start", "restart", "replace", "backoff_elapsed"):
        assert decide(X, Event(kind), c, POLICY).error
    c = decide(D, Event("start"), decide(D, Event("shutdown"), Counters(), POLICY).counters, POLICY)
    assert c.error  # a start queued behind a shutdown is refused
    # a start accepted before the shutdown is dropped by it
    c = decide(D, Event("start"), Counters(), POLICY).counters
    c = decide(D, Event("shutdown"), c, POLICY).counters
    assert decide(D, Event("worker_exited", code=0), c, POLICY).phase == X


def test_the_load_failed_exit_code_is_the_workers():
    from vllmmlxd.worker import main

    assert states.EXIT_LOAD_FAILED == main.EXIT_LOAD_FAILED
