"""The gateway's Ollama listener, pure parts: names (a :latest tag, Ollama's 404), the tags list,
which bodies on the main port's /api/chat are an Ollama client's, and the split by listener."""

import asyncio

import pytest

from vllmmlxd.config.gateway import GatewayConfig, GatewaySpec, Route
from vllmmlxd.errors import ModelNotFound
from vllmmlxd.gateway.cluster import looks_like_ollama, ollama_elsewhere
from vllmmlxd.gateway.ollama import ListenerSplit, requested_model, resolve, tags
from vllmmlxd.gateway.routing import build_table


def route(name, **kw):
    return Route(name=name, served_model_name=name, url=f"http://127.0.0.1:1/{name}", **kw)


TABLE = build_table(
    GatewaySpec(routes=(route("tiny", aliases=("t",), embedding_model="all-minilm-l6-v2"), route("big:latest")))
)


def test_a_latest_tag_is_the_bare_name_and_a_tagged_name_stays_itself():
    assert resolve(TABLE, "tiny", False, None) == (TABLE.by_name["tiny"], None)
    assert resolve(TABLE, "tiny:latest", False, None) == (TABLE.by_name["tiny"], "tiny")
    assert resolve(TABLE, "big:latest", False, None) == (TABLE.by_name["big:latest"], None)
    assert resolve(TABLE, "all-minilm-l6-v2:latest", True, None) == (TABLE.by_name["tiny"], "all-minilm-l6-v2")


def test_an_unknown_model_is_ollamas_not_found_listing_the_models():
    with pytest.raises(ModelNotFound, match='model "nope" not found; available models: tiny, big:latest'):
        resolve(TABLE, "nope", False, None)


def test_show_and_delete_bodies_may_name_the_model_as_name():
    assert requested_model({"name": "tiny"}) == "tiny" and requested_model({"model": "t", "name": "x"}) == "t"


def test_tags_list_every_model_once_the_embedding_model_too():
    names = [m["name"] for m in tags(TABLE.visible(None), [], 0.0)["models"]]
    assert names == ["tiny", "all-minilm-l6-v2", "big:latest"]


@pytest.mark.parametrize(
    "body, ollama",
    [
        ({"model": "m", "messages": [], "stream": True, "max_tokens": 256, "temperature": 0.7}, False),  # the page
        ({"model": "m", "messages": [], "stream": True}, False),
        ({"model": "m", "messages": [], "stream": False}, True),
        ({"model": "m", "messages": [], "stream": False, "max_tokens": 9}, False),
        ({"model": "m", "messages": [], "options": {"seed": 1}}, True),
        ({"model": "m", "messages": [], "keep_alive": "5m", "stream": True}, True),
        ({"model": "m", "messages": [], "format": "json"}, True),
        ({"model": "m", "messages": [], "think": True}, True),
    ],
)
def test_which_bodies_on_the_main_ports_api_chat_are_ollamas(body, ollama):
    assert looks_like_ollama(body) is ollama


def test_the_refusal_points_at_the_ollama_port_or_says_how_to_open_it():
    assert "port 11434" in ollama_elsewhere(11434)
    assert "set gateway.ollama_port" in ollama_elsewhere(None)


def test_connections_to_the_ollama_port_go_to_the_ollama_app():
    seen = []

    def app(name):
        async def answer(scope, receive, send):
            seen.append(name)

        return answer

    split = ListenerSplit(app("main"), ollama=app("ollama"), port=11434)
    for port in (8080, 11434):
        asyncio.run(split({"type": "http", "server": ("127.0.0.1", port)}, None, None))
    asyncio.run(split({"type": "lifespan"}, None, None))
    assert seen == ["main", "ollama", "main"]


def test_the_ollama_port_is_a_listener_of_its_own():
    assert GatewayConfig(port=8080, ollama_port=11434).listeners() == (("127.0.0.1", 8080), ("127.0.0.1", 11434))
    assert GatewaySpec(gateway=GatewayConfig(ollama_port=11434)).extra_listeners() == {
        "--ollama-fd": ("127.0.0.1", 11434)
    }
    assert GatewaySpec().extra_listeners() == {}
    with pytest.raises(ValueError, match="ollama_port and port are both 8080"):
        GatewayConfig(port=8080, ollama_port=8080)
