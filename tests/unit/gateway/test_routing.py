"""The routing table, pure: names, aliases, embedding names, refusals, who sees what, health."""

import pytest
from starlette.requests import Request

from vllmmlxd.config.gateway import GatewaySpec, Route
from vllmmlxd.config.keys import KeyGrant, key_digest
from vllmmlxd.errors import Forbidden, InvalidRequest, ModelNotFound, Unauthorized
from vllmmlxd.gateway.routing import (
    ReplicaSet,
    TableError,
    build_table,
    coming_up,
    health_summary,
    needs_load,
    route_ok,
    serving,
    set_health,
    set_state,
)


def route(name, served=None, **kw):
    return Route(name=name, served_model_name=served or name, url=f"http://127.0.0.1:1/{name}", **kw)


def table(*routes, **gateway):
    return build_table(GatewaySpec(routes=routes, gateway=gateway))


def test_a_route_answers_to_its_served_name_key_and_aliases():
    t = table(route("llama", "llama-3", aliases=("l", "big")), route("qwen"))
    assert {n: t.resolve(n).name for n in ("llama-3", "llama", "l", "big", "qwen")} == {
        "llama-3": "llama",
        "llama": "llama",
        "l": "llama",
        "big": "llama",
        "qwen": "qwen",
    }


def test_embedding_model_names_route_only_embeddings():
    t = table(route("llama", embedding_model="bge-small"), route("qwen"))
    assert t.resolve("bge-small", embeddings=True).name == "llama"
    assert t.resolve("qwen", embeddings=True).name == "qwen"
    with pytest.raises(ModelNotFound):
        t.resolve("bge-small")


def test_unknown_model_lists_the_names():
    t = table(route("llama", "llama-3"), route("qwen", embedding_model="e5"))
    with pytest.raises(ModelNotFound) as err:
        t.resolve("gpt-4")
    assert "'gpt-4'" in err.value.message and "llama-3, qwen" in err.value.message
    assert err.value.code == "model_not_found"
    with pytest.raises(ModelNotFound) as err:
        t.resolve("gpt-4", embeddings=True)
    assert "e5" in err.value.message


def test_missing_model_uses_the_only_route_else_asks_for_one():
    assert table(route("solo")).resolve(None).name == "solo"
    with pytest.raises(InvalidRequest) as err:
        table(route("a"), route("b")).resolve("")
    assert "a, b" in err.value.message
    with pytest.raises(InvalidRequest):
        table(route("a")).resolve(42)


def test_two_routes_cannot_share_a_name():
    with pytest.raises(TableError, match="'x'"):
        table(route("a", aliases=("x",)), route("b", aliases=("x",)))


def keyed_route():
    grants = (
        KeyGrant(name="alice", sha256=key_digest("sk-alice"), allowed=True),
        KeyGrant(name="bob", sha256=key_digest("sk-bob"), allowed=False),
    )
    return route("secret", api_keys=("alice",), key_grants=grants)


def request_with(key=None, client="10.0.0.9", xff=None):
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    if xff:
        headers.append((b"x-forwarded-for", xff.encode()))
    return Request(
        {
            "type": "http",
            "method": "POST",
            "path": "/v1/chat/completions",
            "headers": headers,
            "client": (client, 1234),
            "query_string": b"",
        }
    )


def test_keyed_route_checks_keys_like_a_worker():
    t = table(keyed_route(), route("open"))
    access = t.access["secret"]
    assert access.identify(request_with("sk-alice")).key_name == "alice"
    with pytest.raises(Forbidden):
        access.identify(request_with("sk-bob"))
    with pytest.raises(Unauthorized):
        access.identify(request_with())
    t.access["open"].identify(request_with())  # open: no key needed
    assert [t.may_use(r, k) for r in t.routes for k in (None, "sk-alice", "sk-bob")] == [
        False,
        True,
        False,
        True,
        True,
        True,
    ]


def test_trusted_proxies_come_from_the_gateway():
    t = table(route("open"), trusted_proxies=["10.0.0.0/8"])
    assert t.access["open"].client_address(request_with(client="10.0.0.9", xff="203.0.113.5")) == "203.0.113.5"
    # What the gateway tells a worker its client is (with the daemon's token).
    assert t.client_address(request_with(client="10.0.0.9", xff="203.0.113.5")) == "203.0.113.5"
    assert t.client_address(request_with(client="192.0.2.1", xff="203.0.113.5")) == "192.0.2.1"


def test_lazy_models_need_a_load_unless_ready_or_idle():
    assert [needs_load(route("m", load="lazy", state=s)) for s in ("unloaded", "stopped", "ready", "idle")] == [
        True,
        True,
        False,
        False,
    ]
    assert not needs_load(route("m", state="unloaded"))  # eager: the daemon starts it itself
    assert not needs_load(route("m", kind="upstream", load="lazy", state="unknown"))


def test_health_is_ok_degraded_or_down():
    ready, lazy = route("a", state="ready"), route("b", load="lazy", state="unloaded")
    assert health_summary((ready, lazy)) == (
        "ok",
        {"a": {"state": "ready", "model": "a", "ok": True}, "b": {"state": "unloaded", "model": "b", "ok": True}},
    )
    assert health_summary((ready, route("c", state="failed")))[0] == "degraded"
    assert health_summary((route("c", state="loading"), route("u", kind="upstream", state="unreachable")))[0] == "down"
    assert route_ok(route("l", load="lazy", state="loading")) and not route_ok(route("l", load="lazy", state="failed"))


def test_a_local_model_is_sent_requests_only_while_ready_or_idle():
    # Not ready, its port may be anyone's (another program took it: the model failed to listen).
    assert [
        serving(route("m", state=s))
        for s in ("ready", "idle", "failed", "starting", "backoff", "stopped", "draining", "unknown")
    ] == [True, True] + [False] * 6
    # A lazy one that is not loaded is loaded first (needs_load); an upstream has its own health.
    assert needs_load(route("m", load="lazy", state="failed"))
    assert serving(route("u", kind="upstream", state="unknown"))
    # Starting: the daemon's push showing it ready may be a moment behind (a request waits for it).
    assert [coming_up(route("m", state=s)) for s in ("starting", "unknown", "failed", "backoff", "ready")] == [
        True,
        True,
        False,
        False,
        False,
    ]


def test_a_wrong_name_lists_only_the_models_the_caller_may_use():
    t = table(keyed_route(), route("open", "open-1", embedding_model="e5"))
    with pytest.raises(ModelNotFound) as err:
        t.resolve("gpt-4")
    assert "open-1" in err.value.message and "secret" not in err.value.message
    with pytest.raises(ModelNotFound) as err:
        t.resolve("gpt-4", key="sk-bob")  # a known key, not allowed on secret
    assert "secret" not in err.value.message
    with pytest.raises(ModelNotFound) as err:
        t.resolve("gpt-4", embeddings=True, key="sk-alice")
    assert "secret, open-1, e5" in err.value.message
    with pytest.raises(InvalidRequest) as err:
        t.resolve(None)
    assert "available models: open-1;" not in err.value.message and "open-1" in err.value.message
    assert "secret" not in err.value.message


def test_health_lines_are_only_the_callers_models():
    t = table(keyed_route().model_copy(update={"state": "ready"}), route("open", state="failed"))
    status, lines = health_summary(t.routes, t.visible(None))
    assert status == "degraded" and list(lines) == ["open"]
    assert list(health_summary(t.routes, t.visible("sk-alice"))[1]) == ["secret", "open"]


def test_a_group_name_resolves_to_its_set_and_members_keep_their_names():
    t = table(route("a", "tiny-a", group="tiny"), route("b", group="tiny"), route("solo"))
    rset = t.resolve("tiny")
    assert isinstance(rset, ReplicaSet) and [m.name for m in rset.members] == ["a", "b"]
    assert t.resolve("tiny-a").name == "a" and t.resolve("b").name == "b"
    assert t.names() == ["tiny-a", "b", "solo", "tiny"]  # the group's name once
    with pytest.raises(ModelNotFound) as err:
        t.resolve("nope")
    assert err.value.message.endswith("solo, tiny")


def test_a_group_cannot_take_a_routes_name():
    with pytest.raises(TableError, match="group 'b'"):
        table(route("a", group="b"), route("b", group="b"))


def test_a_keyed_sets_key_is_its_members():
    grants = keyed_route().key_grants
    t = table(
        route("a", group="g", api_keys=("alice",), key_grants=grants),
        route("b", group="g", api_keys=("alice",), key_grants=grants),
    )
    rset = t.resolve("g")
    assert t.access_of(rset).identify(request_with("sk-alice")).key_name == "alice"
    with pytest.raises(Forbidden):
        t.access_of(rset).identify(request_with("sk-bob"))
    assert [s.name for s in t.visible_sets("sk-alice")] == ["g"] and t.visible_sets(None) == []
    assert t.names(key=None) == []


@pytest.mark.parametrize(
    "states, shown",
    [
        (("failed", "idle"), "ready"),
        (("failed", "ready"), "ready"),
        (("backoff", "starting"), "starting"),
        (("failed", "unloaded"), "unloaded"),
        (("failed", "stopped"), "failed"),
    ],
)
def test_a_set_is_ready_while_a_member_serves_else_its_most_hopeful_members_state(states, shown):
    assert set_state(tuple(route(f"m{i}", state=s) for i, s in enumerate(states))) == shown


def test_a_sets_health_shows_each_member_with_its_outstanding_requests():
    rset = ReplicaSet("g", (route("a", state="ready", group="g"), route("b", state="backoff", group="g")))
    assert set_health(rset, {"a": 3}, frozenset({"b"})) == {
        "state": "ready",
        "ok": True,
        "members": {
            "a": {"state": "ready", "outstanding": 3, "ejected": False},
            "b": {"state": "backoff", "outstanding": 0, "ejected": True},
        },
    }
