"""The supervisor's decisions, pure: idle unloads, memory admission with room made least recently
used first, and a reload's steps per entry. What the e2e tests once checked with sleeps through
a real daemon is decided here from facts."""

from __future__ import annotations

from vllmmlxd.config.diff import ReloadPlan, classify
from vllmmlxd.supervisor import states
from vllmmlxd.supervisor.plan import (
    Answer,
    EntryFacts,
    Join,
    Load,
    LoadWanted,
    Tick,
    UnitFacts,
    Unload,
    plan,
    plan_reload,
)


def lazy(name, state=states.READY, idle_s=None, mb=100, idle_unload_s=None, busy=None) -> UnitFacts:
    return UnitFacts(name, "model", state, True, mb, idle_s, idle_unload_s, busy)


def eager(name, state=states.READY, mb=100) -> UnitFacts:
    return UnitFacts(name, "model", state, False, mb)


def units(*facts: UnitFacts) -> dict[str, UnitFacts]:
    return {f.name: f for f in facts}


# -- idle unloads --------------------------------------------------------------


def test_a_lazy_model_idle_for_its_limit_is_unloaded_and_nothing_else():
    got = plan(
        units(
            lazy("due", idle_s=30.0, idle_unload_s=30),
            lazy("soon", idle_s=29.0, idle_unload_s=30),
            lazy("busy", idle_s=None, idle_unload_s=30),
            lazy("forever", idle_s=999.0),
            eager("eager"),
            lazy("loading", state=states.STARTING, idle_unload_s=1),
        ),
        None,
        Tick(),
    )
    assert got == [Unload("due", "idle")]


def test_an_idle_unload_leaves_alone_a_model_an_operation_is_on():
    # The race this rules out: a reload swapping a lazy model while the idle unloader stops it.
    for busy in ("reloading", "loading", "unloading", "stopping"):
        assert plan(units(lazy("m", idle_s=60.0, idle_unload_s=30, busy=busy)), None, Tick()) == []


# -- loads and memory admission ------------------------------------------------


def test_a_load_joins_a_model_that_is_loaded_or_on_its_way():
    for facts in (
        lazy("m"),
        lazy("m", state=states.STARTING),
        lazy("m", state=states.UNLOADED, busy="loading"),
        eager("m", state=states.STARTING),
        lazy("m", busy="reloading", state=states.UNLOADED),
    ):
        assert plan(units(facts), 1000, LoadWanted("m")) == [Join("m")]


def test_a_model_stopped_on_purpose_or_failed_is_not_loaded_by_a_request():
    stopped = plan(units(lazy("m", state=states.STOPPED)), 1000, LoadWanted("m"))
    assert stopped == [Answer("m", False, "model m is stopped (vllmmlxctl start m)")]
    failed = plan(units(UnitFacts("m", state=states.FAILED, lazy=True, error="boom")), 1000, LoadWanted("m"))
    assert failed[0].ok is False and "boom" in failed[0].message
    # vllmmlxctl start does load it, through admission.
    assert plan(units(lazy("m", state=states.STOPPED)), 1000, LoadWanted("m", start=True)) == [Load("m")]


def test_a_load_that_fits_unloads_nothing():
    got = plan(units(lazy("m", state=states.UNLOADED), eager("e"), lazy("idle", idle_s=500.0)), 300, LoadWanted("m"))
    assert got == [Load("m")]


def test_room_is_made_from_idle_lazy_models_least_recently_used_first():
    facts = units(
        lazy("new", state=states.UNLOADED),
        eager("e"),
        lazy("recent", idle_s=5.0),
        lazy("oldest", idle_s=500.0),
        lazy("older", idle_s=50.0),
    )
    assert plan(facts, 400, LoadWanted("new")) == [Unload("oldest", "memory", "new"), Load("new")]
    assert plan(facts, 300, LoadWanted("new")) == [
        Unload("oldest", "memory", "new"),
        Unload("older", "memory", "new"),
        Load("new"),
    ]


def test_busy_eager_loading_and_operated_on_models_are_never_evicted():
    facts = units(
        lazy("new", state=states.UNLOADED),
        eager("e"),
        lazy("busy", idle_s=None),
        lazy("loading", state=states.STARTING),
        lazy("reloading", idle_s=900.0, busy="reloading"),
    )
    (answer,) = plan(facts, 400, LoadWanted("new"))
    assert isinstance(answer, Answer) and not answer.ok
    assert "not enough memory to load new" in answer.message and "busy 100 MB (busy or eager)" in answer.message


def test_a_load_in_flight_counts_against_memory_before_its_worker_runs():
    facts = units(lazy("new", state=states.UNLOADED), lazy("first", state=states.UNLOADED, busy="loading"))
    (answer,) = plan(facts, 150, LoadWanted("new"))
    assert isinstance(answer, Answer) and not answer.ok and "first 100 MB" in answer.message.replace("100.0", "100")


def test_a_model_being_unloaded_is_loaded_again_through_admission():
    facts = units(lazy("m", state=states.DRAINING, busy="unloading"))
    assert plan(facts, 1000, LoadWanted("m")) == [Load("m")]


def test_an_upstream_answers_from_its_health():
    up = UnitFacts("far", "upstream", states.UNREACHABLE, error="cannot reach it")
    assert plan(units(up), None, LoadWanted("far")) == [Answer("far", False, "cannot reach it")]
    assert plan(units(UnitFacts("far", "upstream", states.READY)), None, LoadWanted("far"))[0].ok


def test_an_unknown_name_is_answered_with_the_names():
    (answer,) = plan(units(eager("a")), None, LoadWanted("b"))
    assert not answer.ok and "models: a" in answer.message


# -- reloads -------------------------------------------------------------------


def diff(added=(), removed=(), changed=None) -> ReloadPlan:
    changed = changed or {}
    return ReloadPlan(
        added=tuple(added),
        removed=tuple(removed),
        changed=changed,
        changes={n: classify(k) for n, k in changed.items()},
    )


HERE = EntryFacts("model", ("127.0.0.1", 8000))


def test_a_reload_frees_sockets_first_and_starts_after():
    d = diff(added=["new"], removed=["old"], changed={"moved": ("port",), "live": ("timeout",), "big": ("model",)})
    facts = units(eager("old"), eager("moved"), eager("live"), eager("big"))
    addresses = {
        "old": ("127.0.0.1", 1),
        "moved": ("127.0.0.1", 2),
        "live": ("127.0.0.1", 8000),
        "big": ("127.0.0.1", 8000),
    }
    entries = {"new": HERE, "moved": EntryFacts("model", ("127.0.0.1", 1)), "live": HERE, "big": HERE}
    steps = plan_reload(d, facts, addresses, entries, frozenset(), live_push=True)
    assert steps.first == (("old", "remove"), ("moved", "move"))
    assert steps.then == (("moved", "move"), ("live", "live"), ("big", "stop_start"), ("new", "add"))
    swapped = plan_reload(d, facts, addresses, entries, frozenset({"big"}), live_push=False)
    assert dict(swapped.then)["big"] == "swap" and dict(swapped.then)["live"] == "stop_start"


def test_an_unloaded_lazy_model_adopts_its_new_entry_and_a_kind_change_is_a_new_unit():
    d = diff(changed={"l": ("model",), "k": ("upstream",)})
    facts = units(lazy("l", state=states.UNLOADED), eager("k"))
    entries = {"l": HERE, "k": EntryFacts("upstream", None)}
    steps = plan_reload(d, facts, {"l": HERE.address, "k": HERE.address}, entries, frozenset({"l"}), live_push=True)
    assert steps.first == (("k", "remove"),) and steps.then == (("l", "adopt"), ("k", "add"))
