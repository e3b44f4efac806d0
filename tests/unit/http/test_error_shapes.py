"""Whose error shape a request is answered in: by its path, or by its app's own family."""

import asyncio
import json

from starlette.requests import Request

from vllmmlxd.http.error_shapes import FAMILY_KEY, ErrorFamily, family, render_error


def request(path, **scope):
    return Request({"type": "http", "method": "POST", "path": path, "headers": [], "query_string": b"", **scope})


def test_the_family_by_path_or_by_the_apps_own():
    assert family(request("/v1/chat/completions")) == "openai"
    assert family(request("/v1/messages")) == "anthropic"
    assert family(request("/ollama/api/chat")) == "ollama"
    assert family(request("/api/chat", **{FAMILY_KEY: "ollama"})) == "ollama"


def test_ollamas_shape_is_the_message_alone_and_a_missing_field_a_400():
    response = render_error(request("/ollama/api/chat"), 422, "messages: required", "invalid_request_error")
    assert response.status_code == 400 and json.loads(response.body) == {"error": "messages: required"}


def test_an_app_names_its_family_for_every_request():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope.get(FAMILY_KEY))

    asyncio.run(ErrorFamily(app, "ollama")({"type": "http", "path": "/api/chat"}, None, None))
    assert seen == ["ollama"]
