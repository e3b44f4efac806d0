"""What the gateway's /api/* tell an API client, pure: the daemon's status as far as a key reaches,
and a model list that asks for a key rather than coming back empty."""

import pytest

from vllmmlxd.config.gateway import GatewaySpec, Route
from vllmmlxd.config.keys import KeyGrant, key_digest
from vllmmlxd.errors import Unauthorized
from vllmmlxd.gateway.cluster import require_some_route, status_for
from vllmmlxd.gateway.routing import build_table

GRANTS = (
    KeyGrant(name="alice", sha256=key_digest("sk-alice"), allowed=True, mcp=("docs",)),
    KeyGrant(name="bob", sha256=key_digest("sk-bob"), allowed=True),
    KeyGrant(name="carol", sha256=key_digest("sk-carol"), allowed=False),
)


def route(name, **kw):
    return Route(name=name, served_model_name=name, url=f"http://127.0.0.1:1/{name}", state="ready", **kw)


def keyed(name, allowed=("alice", "bob")):
    grants = tuple(g.model_copy(update={"allowed": g.name in allowed}) for g in GRANTS)
    return route(name, api_keys=allowed, key_grants=grants)


def mcp_row(name, stderr="ERR: token=sk-from-env"):
    return {
        "name": name,
        "transport": "stdio",
        "state": "failed",
        "tools": 0,
        "connects": 1,
        "last_error": f"connection closed (stderr: {stderr})",
        "stderr": [stderr],
    }


def daemon_status():
    return {
        "daemon": {
            "pid": 41,
            "uptime_s": 9.5,
            "config_path": "/etc/vllmmlxd/config.yaml",
            "config_hash": "abc",
            "version": "1.0",
            "last_reload": {"ok": False, "at": 1, "error": "/etc/vllmmlxd/config.yaml:3:1: x"},
        },
        "gateway": {
            "state": "ready",
            "pid": 42,
            "host": "127.0.0.1",
            "port": 8080,
            "restarts": 0,
            "uptime_s": 9.0,
            "last_error": "boom",
            "ui": True,
            "version": 3,
        },
        "models": [
            {
                "name": "shared",
                "state": "ready",
                "pid": 43,
                "host": "127.0.0.1",
                "port": 8001,
                "served_model_name": "shared",
                "keys": ["alice", "bob"],
                "last_error": None,
                "blas_path": "/opt/lib/libmkl.so",
                "running": 1,
                "mcp": [mcp_row("docs"), mcp_row("shell")],
            },
            {
                "name": "bobs",
                "state": "failed",
                "pid": None,
                "host": "127.0.0.1",
                "port": 8002,
                "served_model_name": "bobs",
                "keys": ["bob"],
                "last_error": "Traceback: secret=xyz",
            },
            {
                "name": "open",
                "state": "ready",
                "pid": 44,
                "host": "127.0.0.1",
                "port": 8003,
                "served_model_name": "open",
                "keys": None,
                "mcp": [mcp_row("docs")],
                "a_field_added_later": "?",
            },
        ],
    }


@pytest.fixture
def table():
    return build_table(GatewaySpec(routes=(keyed("shared"), keyed("bobs", allowed=("bob",)), route("open"))))


def test_a_key_sees_only_its_models_without_pids_paths_other_keys_or_error_output(table):
    seen = status_for(daemon_status(), table, "sk-alice")
    assert seen["daemon"] == {"uptime_s": 9.5, "version": "1.0"}
    assert seen["gateway"] == {
        "state": "ready",
        "host": "127.0.0.1",
        "port": 8080,
        "restarts": 0,
        "uptime_s": 9.0,
        "ui": True,
        "version": 3,
    }
    assert [m["name"] for m in seen["models"]] == ["shared", "open"]
    shared, opened = seen["models"]
    assert shared["keys"] == ["alice"] and opened["keys"] is None
    # Alice's key may use the docs server only; no server's error text or stderr is shown.
    assert shared["mcp"] == [{"name": "docs", "transport": "stdio", "state": "failed", "tools": 0, "connects": 1}]
    assert opened["mcp"] == [{"name": "docs", "transport": "stdio", "state": "failed", "tools": 0, "connects": 1}]
    text = repr(seen)
    for hidden in (
        "pid",
        "config",
        "/etc",
        "/opt",
        "last_error",
        "stderr",
        "sk-from-env",
        "bob",
        "a_field_added_later",
    ):
        assert hidden not in text, hidden
    bobs = status_for(daemon_status(), table, "sk-bob")
    assert [m["name"] for m in bobs["models"]] == ["shared", "bobs", "open"]
    assert [len(m["mcp"]) for m in bobs["models"] if "mcp" in m] == [2, 1]  # no mcp list: every server
    assert "secret=xyz" not in repr(bobs) and "alice" not in repr(bobs)
    assert [m["name"] for m in status_for(daemon_status(), table, None)["models"]] == ["open"]
    assert status_for({"models": "x"}, table, None) == {"daemon": {}, "models": []}


def test_the_model_list_asks_for_a_key_when_none_it_may_use_remains(table):
    assert [r.name for r in require_some_route(table, None)] == ["open"]
    locked = build_table(GatewaySpec(routes=(keyed("shared"), keyed("bobs", allowed=("bob",)))))
    for key in (None, "sk-wrong", "sk-carol"):
        with pytest.raises(Unauthorized):
            require_some_route(locked, key)
    assert [r.name for r in require_some_route(locked, "sk-alice")] == ["shared"]
    assert require_some_route(build_table(GatewaySpec()), None) == []  # no model at all: an empty list


def test_a_key_sees_the_sets_it_may_use_with_their_members_states_and_load():
    t = build_table(
        GatewaySpec(
            routes=(
                keyed("k1", allowed=("bob",)).model_copy(update={"group": "locked"}),
                keyed("k2", allowed=("bob",)).model_copy(update={"group": "locked"}),
                route("o1", group="pool"),
                route("o2", group="pool"),
            )
        )
    )
    member = {"name": "o1", "state": "ready", "running": 2, "waiting": 0, "pid": 7, "last_error": "x"}
    daemon = {
        "models": [{"name": "o1", "state": "ready", "group": "pool", "pid": 7}],
        "groups": [
            {"name": "pool", "state": "ready", "members": [member]},
            {"name": "locked", "state": "ready", "members": [{"name": "k1", "state": "ready"}]},
        ],
    }
    seen = status_for(daemon, t, None)
    assert seen["models"] == [{"name": "o1", "state": "ready", "group": "pool", "keys": None}]
    assert seen["groups"] == [
        {"name": "pool", "state": "ready", "members": [{"name": "o1", "state": "ready", "running": 2, "waiting": 0}]}
    ]
    assert [g["name"] for g in status_for(daemon, t, "sk-bob")["groups"]] == ["pool", "locked"]


def test_a_downloading_entry_shows_its_progress_and_the_pulls_show_to_who_may_use_every_model(table):
    pull = {
        "id": "p1",
        "repo": "org/m",
        "state": "downloading",
        "percent": 37.0,
        "done_bytes": 37,
        "total_bytes": 100,
        "path": "/state/models/hub-org--m",
        "error": None,
    }
    status = daemon_status()
    status["models"][2] = {**status["models"][2], "state": "downloading", "download": pull}
    status["pulls"] = [pull, {**pull, "id": "p0", "state": "failed", "error": "HF_TOKEN..."}]
    opened = status_for(status, table, None)
    assert opened["models"][0]["state"] == "downloading"
    assert opened["models"][0]["download"] == {
        "repo": "org/m",
        "state": "downloading",
        "percent": 37.0,
        "done_bytes": 37,
        "total_bytes": 100,
    }
    assert "pulls" not in opened  # an anonymous caller may not use every model
    bobs = status_for(status, table, "sk-bob")  # bob's key opens every model
    assert [p["repo"] for p in bobs["pulls"]] == ["org/m"] and "/state" not in repr(bobs)
    assert "HF_TOKEN" not in repr(bobs)
