"""Which idle lazy models make room for a load, and when one is idle long enough to unload."""

from __future__ import annotations

from vllmmlxd.supervisor.lazy import Resident, idle_for, make_room, should_unload
from vllmmlxd.supervisor.memory import Capacity, Footprint, plan_memory


def test_it_fits_without_unloading_anything():
    room = make_room("c", 300, 1000, [Resident("a", 300), Resident("b", 300, idle_s=50)])
    assert room.fits and room.evict == ()


def test_the_least_recently_used_idle_model_goes_first_and_only_as_many_as_needed():
    resident = [
        Resident("eager", 300),
        Resident("recent", 300, idle_s=5),
        Resident("old", 300, idle_s=500),
        Resident("older", 100, idle_s=900),
    ]
    room = make_room("new", 400, 1100, resident)
    # 1000 in use, 100 free: "older" (100) is not enough alone, "old" comes next; "recent" stays.
    assert room.fits and room.evict == ("older", "old")


def test_busy_and_eager_models_are_never_unloaded_and_the_refusal_has_the_numbers():
    room = make_room("new", 400, 700, [Resident("eager", 300), Resident("busy", 300)])
    assert not room.fits and room.evict == ()
    assert room.message.startswith("not enough memory to load new: it needs 400 MB, 100 MB of 700 MB usable are free")
    assert "eager 300 MB (busy or eager)" in room.message and "no idle lazy model is left to unload" in room.message


def test_unknown_memory_is_not_checked():
    assert make_room("new", 10**9, None, [Resident("a", 10**9)]).fits


def test_idle_time_grows_from_the_last_report_and_a_busy_worker_is_not_idle():
    assert idle_for(3.0, reported_at=100.0, now=104.5) == 7.5
    assert idle_for(0.0, reported_at=100.0, now=200.0) is None  # a request was in flight
    assert idle_for(None, reported_at=None, now=200.0) is None
    # A client turned away while it loaded retries by 110: not idle before then, idle after.
    assert idle_for(3.0, reported_at=100.0, now=104.5, expected_until=110.0) is None
    assert idle_for(3.0, reported_at=100.0, now=111.0, expected_until=110.0) == 14.0
    assert should_unload(900.0, 900) and not should_unload(899.9, 900)
    assert not should_unload(None, 10) and not should_unload(10_000.0, None)


def test_only_the_largest_lazy_model_counts_at_admission():
    fp = lambda total: Footprint(weights_mb=total - 200, cache_mb=0)  # noqa: E731
    plan = plan_memory(
        Capacity(4000, 0), {"eager": fp(1000), "l1": fp(2000), "l2": fp(2500)}, lazy=frozenset({"l1", "l2"})
    )
    assert plan.needed_mb == 3500 and plan.fits
    assert "l2: 2,500 MB" in plan.render() and "(lazy: only the largest lazy model is counted)" in plan.render()
    assert not plan_memory(Capacity(3000, 0), {"eager": fp(1000), "l2": fp(2500)}, lazy=frozenset({"l2"})).fits
