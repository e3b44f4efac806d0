"""The balancer, pure: order by load, round-robin, affinity within its slack, ejection, the set's table."""

from __future__ import annotations

import pytest

from vllmmlxd.config.gateway import GatewaySpec, Route
from vllmmlxd.gateway.balance import (
    AFFINITY_SLACK,
    EJECT_S,
    AffinityTable,
    Member,
    Replicas,
    estimate_tokens,
    fallback,
    order,
)
from vllmmlxd.gateway.routing import ReplicaSet, build_table


def route(name: str, state: str = "ready", **kw) -> Route:
    return Route(name=name, served_model_name=name, url=f"http://127.0.0.1:1/{name}", state=state, group="g", **kw)


def member(name: str, index: int, outstanding: int = 0, tokens: int = 0, ejected: bool = False) -> Member:
    return Member(route(name), index, outstanding, tokens, ejected)


def names(members) -> list[str]:
    return [m.name for m in members]


def test_least_outstanding_first_then_fewest_tokens_in_flight():
    ms = [member("a", 0, 3), member("b", 1, 1, tokens=900), member("c", 2, 1, tokens=100)]
    assert names(order(ms)) == ["c", "b", "a"]


def test_ties_go_round_robin_from_the_turn():
    ms = [member("a", 0), member("b", 1), member("c", 2)]
    assert [names(order(ms, turn=t))[0] for t in range(6)] == ["a", "b", "c", "a", "b", "c"]
    assert names(order(ms, turn=1)) == ["b", "c", "a"]  # the rest follow in turn: each tried once


def test_the_conversations_member_comes_first_within_the_slack():
    ms = [member("a", 0, 0), member("b", 1, AFFINITY_SLACK)]
    assert names(order(ms, preferred="b")) == ["b", "a"]
    busier = [member("a", 0, 0), member("b", 1, AFFINITY_SLACK + 1)]
    assert names(order(busier, preferred="b")) == ["a", "b"]  # too busy: load decides


def test_ejected_members_come_last_and_lose_their_affinity():
    ms = [member("a", 0, 0, ejected=True), member("b", 1, 5), member("c", 2, 9)]
    assert names(order(ms, preferred="a")) == ["b", "c", "a"]
    # The slack is measured from the least loaded member that is not ejected.
    assert names(order(ms, preferred="c")) == ["b", "c", "a"]
    assert names(order([member("a", 0, ejected=True)])) == ["a"]  # tried anyway: never refused outright


def test_a_preferred_member_that_is_not_a_candidate_changes_nothing():
    ms = [member("a", 0, 1), member("b", 1, 0)]
    assert names(order(ms, preferred="gone")) == ["b", "a"]
    assert order([]) == []


def test_the_affinity_table_is_a_bounded_lru_with_a_time_to_live():
    t = AffinityTable(capacity=2, ttl_s=10)
    t.put("k1", "a", now=0)
    t.put("k2", "b", now=1)
    assert t.get("k1", now=2) == "a"
    t.put("k1", "a", now=2)  # used again: k2 is now the oldest
    t.put("k3", "c", now=3)
    assert (t.get("k2", now=3), t.get("k1", now=3), t.get("k3", now=3), len(t)) == (None, "a", "c", 2)
    t.put("k1", "b", now=4)  # the member that answered last
    assert t.get("k1", now=5) == "b"
    assert t.get("k1", now=14.5) is None and len(t) == 1  # quiet past its time: forgotten


def test_estimated_tokens_are_the_prompt_bytes_over_four_plus_what_may_be_generated():
    assert estimate_tokens(400, {"max_tokens": 50}) == 150
    assert estimate_tokens(400, {"max_completion_tokens": 20, "max_tokens": 50}) == 120
    assert estimate_tokens(400, {"max_tokens": "many"}) == estimate_tokens(400, {"max_tokens": True}) == 100


def set_of(*routes: Route) -> ReplicaSet:
    return ReplicaSet("g", routes)


def test_replicas_count_in_flight_work_and_spread_a_burst():
    r = Replicas()
    rset = set_of(route("a"), route("b"))
    chosen = []
    for _ in range(4):
        first = r.plan(rset, None, now=0)[0]
        r.begin(first.name, 10)
        chosen.append(first.name)
    assert sorted(chosen) == ["a", "a", "b", "b"] and r.outstanding == {"a": 2, "b": 2}
    r.end("a", 10)
    r.end("a", 10)
    assert r.plan(rset, None, now=0)[0].name == "a" and r.tokens["a"] == 0


def test_only_members_that_serve_are_planned():
    r = Replicas()
    rset = set_of(
        route("down", "backoff"),
        route("lazy", "unloaded", load="lazy"),
        route("far", "unreachable", kind="upstream"),
        route("up", "idle", load="lazy"),
        route("there", "ready", kind="upstream"),
    )
    assert sorted(m.name for m in r.plan(rset, None, now=0)) == ["there", "up"]


def test_a_conversation_returns_to_the_member_that_answered_it():
    r = Replicas()
    rset = set_of(route("a"), route("b"))
    first = r.plan(rset, "conv", now=0)[0].name
    r.answered(rset, "conv", first, now=0)
    other = "b" if first == "a" else "a"
    assert [r.plan(rset, "conv", now=t)[0].name for t in range(1, 5)] == [first] * 4
    r.begin(first, 0)
    r.begin(first, 0)
    r.begin(first, 0)  # 3 ahead of the other: beyond the slack, load decides
    assert r.plan(rset, "conv", now=5)[0].name == other


def test_an_ejected_member_is_tried_last_until_its_time_passes_or_a_push_shows_it_ready():
    r = Replicas()
    a, b = route("a"), route("b")
    rset = set_of(a, b)
    r.eject("a", now=100)
    assert [names(r.plan(rset, None, now=100 + t)) for t in (0, 1)] == [["b", "a"], ["b", "a"]]
    assert r.ejected(100) == {"a"} and r.ejected(100 + EJECT_S) == set()
    r.eject("a", now=200)
    spec = GatewaySpec(gateway={}, routes=(route("a", "backoff"), b))
    back = GatewaySpec(gateway={}, routes=(a, b))
    r.swapped(build_table(spec), build_table(spec))  # still not serving: still ejected
    assert r.ejected(200) == {"a"}
    r.swapped(build_table(spec), build_table(back))
    assert r.ejected(200) == set()


@pytest.mark.parametrize(
    "states, chosen",
    [
        (("backoff", "unloaded"), "b"),  # a lazy member that can be loaded
        (("starting", "failed"), "a"),  # else one on its way to ready
        (("failed", "stopped"), None),
    ],
)
def test_with_no_member_serving_one_lazy_or_starting_member_is_the_fallback(states, chosen):
    rset = set_of(route("a", states[0]), route("b", states[1], load="lazy"))
    got = fallback(rset)
    assert (got.name if got else None) == chosen
