"""Pure pieces of the pass-through and of /api/*: headers, body translations, listings, error events."""

import json

import pytest

from vllmmlxd.config.gateway import GatewaySpec, Route
from vllmmlxd.errors import InvalidRequest
from vllmmlxd.gateway.app import model_cards
from vllmmlxd.gateway.cluster import chat_body, complete_body, model_entry
from vllmmlxd.gateway.dispatch import body_for, parse_object, sse_error, sse_error_from
from vllmmlxd.gateway.proxy import request_headers, response_headers
from vllmmlxd.gateway.routing import build_table


def test_request_headers_drop_hop_by_hop_and_append_the_client():
    given = [
        (b"Host", b"gw:8080"),
        (b"Content-Length", b"12"),
        (b"Connection", b"keep-alive, X-Secret-Hop"),
        (b"Keep-Alive", b"5"),
        (b"TE", b"trailers"),
        (b"Transfer-Encoding", b"chunked"),
        (b"Upgrade", b"h2c"),
        (b"Proxy-Authorization", b"x"),
        (b"X-Secret-Hop", b"1"),
        (b"X-Forwarded-For", b"198.51.100.1"),
        (b"Authorization", b"Bearer sk-client"),
        (b"x-request-id", b"abc"),
        (b"Content-Type", b"application/json"),
    ]
    out = request_headers(given, "10.0.0.2")
    assert out == [
        (b"authorization", b"Bearer sk-client"),
        (b"x-request-id", b"abc"),
        (b"content-type", b"application/json"),
        (b"x-forwarded-for", b"198.51.100.1, 10.0.0.2"),
    ]


def test_a_browsers_own_headers_stop_at_the_gateway():
    # The gateway checked the page's Origin; a worker would refuse an origin that is not its own.
    given = [
        (b"Origin", b"http://127.0.0.1:8080"),
        (b"Referer", b"http://127.0.0.1:8080/"),
        (b"Cookie", b"a=b"),
        (b"Sec-Fetch-Site", b"same-origin"),
        (b"Sec-Fetch-Mode", b"cors"),
        (b"content-type", b"application/json"),
    ]
    assert request_headers(given, "127.0.0.1") == [
        (b"content-type", b"application/json"),
        (b"x-forwarded-for", b"127.0.0.1"),
    ]


def test_upstream_key_replaces_the_clients():
    out = dict(
        request_headers(
            [(b"authorization", b"Bearer sk-client"), (b"x-api-key", b"k")], "::1", upstream=True, upstream_key="sk-up"
        )
    )
    assert out == {b"x-forwarded-for": b"::1", b"authorization": b"Bearer sk-up"}


def test_an_upstream_without_its_own_key_never_gets_the_clients():
    # The client's key is for this host; another host's daemon gets none rather than that one.
    given = [
        (b"Authorization", b"Bearer sk-local"),
        (b"X-Api-Key", b"sk-local"),
        (b"content-type", b"application/json"),
    ]
    out = request_headers(given, "10.0.0.2", upstream=True)
    assert out == [(b"content-type", b"application/json"), (b"x-forwarded-for", b"10.0.0.2")]
    # Nor the daemon's token, were one given.
    assert dict(request_headers(given, "10.0.0.2", upstream=True, token="t0k")).keys() == {
        b"content-type",
        b"x-forwarded-for",
    }


def test_a_local_worker_gets_the_clients_key_the_token_and_the_judged_client():
    given = [
        (b"authorization", b"Bearer sk-local"),
        (b"X-Vllmmlxd-Gateway-Token", b"forged"),
        (b"x-vllmmlxd-client", b"6.6.6.6"),
        (b"x-forwarded-for", b"6.6.6.6"),
    ]
    # A client's own claim to be the gateway is dropped, whether or not the gateway has a token.
    assert request_headers(given, "127.0.0.1") == [
        (b"authorization", b"Bearer sk-local"),
        (b"x-forwarded-for", b"6.6.6.6, 127.0.0.1"),
    ]
    out = request_headers(given, "10.0.0.1", token="t0k", client="203.0.113.7")
    assert out == [
        (b"authorization", b"Bearer sk-local"),
        (b"x-forwarded-for", b"6.6.6.6, 10.0.0.1"),
        (b"x-vllmmlxd-gateway-token", b"t0k"),
        (b"x-vllmmlxd-client", b"203.0.113.7"),
    ]


def test_response_headers_keep_length_and_drop_hop_by_hop():
    given = [
        (b"content-length", b"3"),
        (b"connection", b"close"),
        (b"transfer-encoding", b"chunked"),
        (b"date", b"x"),
        (b"server", b"uvicorn"),
        (b"x-request-id", b"chatcmpl-1"),
        (b"Retry-After", b"1"),
    ]
    assert response_headers(given) == [
        (b"content-length", b"3"),
        (b"x-request-id", b"chatcmpl-1"),
        (b"retry-after", b"1"),
    ]


def test_api_chat_becomes_a_streamed_openai_chat():
    body = chat_body(
        {
            "model": "llama",
            "system": "Be brief.",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "temperature": 0.2,
            "top_p": 0.9,
            "seed": 3,
        }
    )
    assert body == {
        "model": "llama",
        "max_tokens": 8,
        "temperature": 0.2,
        "top_p": 0.9,
        "seed": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    }
    assert chat_body({"messages": [], "stream": False})["stream"] is True  # always streamed
    with pytest.raises(InvalidRequest):
        chat_body({"model": "x"})


def test_api_complete_streams_unless_told_not_to():
    assert complete_body({"model": "m", "prompt": "a"}) == {
        "model": "m",
        "prompt": "a",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert complete_body({"prompt": "a", "stream": False, "stream_options": {}}) == {"prompt": "a", "stream": False}
    with pytest.raises(InvalidRequest):
        complete_body({"model": "m"})


def test_bodies_pass_as_given_except_to_upstreams_under_another_name():
    local = Route(name="a", served_model_name="A", url="http://x")
    up = Route(name="b", served_model_name="B", url="http://y", kind="upstream", embedding_model="e")
    raw = b'{"model": "a",  "x": 1}'
    assert body_for(local, json.loads(raw), raw) is raw
    assert json.loads(body_for(up, {"model": "b", "x": 1}, raw)) == {"model": "B", "x": 1}
    assert body_for(up, {"model": "e"}, b"same") == b"same"


def test_parse_object_refuses_non_objects():
    assert parse_object(b'{"a": 1}') == {"a": 1}
    for bad in (b"", b"[1]", b"{", b"\xff"):
        with pytest.raises(InvalidRequest):
            parse_object(bad)


def test_sse_errors_in_each_family():
    assert sse_error(False, 503, "no", "overloaded_error", "model_not_loaded") == (
        b'data: {"error": {"message": "no", "type": "overloaded_error", "param": null, "code": "model_not_loaded"}}\n\n'
    )
    assert sse_error(True, 503, "no", "overloaded_error") == (
        b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "no"}}\n\n'
    )
    assert sse_error_from(True, 400, b'{"type": "error", "error": {"type": "x", "message": "m"}}').startswith(
        b"event: error\n"
    )
    assert b"HTTP 500" in sse_error_from(False, 500, b"oops")


def test_listings():
    r = Route(
        name="llama",
        served_model_name="llama-3",
        aliases=("l",),
        url="http://x",
        state="idle",
        load="lazy",
        embedding_model="bge",
    )
    assert model_entry(r) == {
        "id": "llama",
        "name": "llama-3",
        "aliases": ["l"],
        "state": "idle",
        "kind": "local",
        "load": "lazy",
        "owned_by": "vllmmlxd",
        "embedding_model": "bge",
    }
    cards = model_cards(r, 7)
    assert [(c["id"], c["entry"], c["state"]) for c in cards] == [
        ("llama-3", "llama", "idle"),
        ("bge", "llama", "idle"),
    ]
    assert cards[0]["object"] == "model" and cards[0]["created"] == 7 and cards[0]["aliases"] == ["l"]


def test_spec_round_trips_through_its_worker_json_token_included():
    spec = GatewaySpec(
        routes=(
            Route(name="a", served_model_name="a", url="http://x", upstream_api_key="sk"),
            Route(name="b", served_model_name="b", url="http://y", gateway_token="t0k"),
        )
    )
    again = GatewaySpec.model_validate_json(spec.to_worker_json())
    assert again.config_hash() == spec.config_hash()
    assert build_table(again).routes[0].upstream_api_key.get_secret_value() == "sk"
    assert build_table(again).routes[1].gateway_token.get_secret_value() == "t0k"
    assert "t0k" not in repr(spec) and "t0k" not in str(spec.model_dump())


def test_the_daemons_routes_carry_each_local_workers_token_and_no_upstream_gets_one():
    from vllmmlxd.config.schema import Config
    from vllmmlxd.supervisor.gateway import build_spec

    config = Config.model_validate(
        {"gateway": {}, "models": {"here": {"model": "builtin:tiny", "port": 8001}, "far": {"upstream": "http://h:1"}}}
    )
    here, far = build_spec(config.gateway, config.models, {}, None).routes
    assert here.gateway_token == config.models["here"].gateway_token is not None
    assert far.gateway_token is None
    table = build_table(
        GatewaySpec.model_validate_json(build_spec(config.gateway, config.models, {}, None).to_worker_json())
    )
    assert table.routes[0].gateway_token == here.gateway_token


def test_a_worker_bound_to_localhost_is_dialled_at_the_address_the_daemon_bound():
    # bind_tcp binds "localhost" as 127.0.0.1; the name could resolve to ::1 first, which another program may hold.
    from vllmmlxd.config.schema import ResolvedModel
    from vllmmlxd.supervisor.gateway import build_route

    assert (
        build_route("m", ResolvedModel(model="builtin:tiny", host="localhost", port=8001), "ready", None).url
        == "http://127.0.0.1:8001"
    )
