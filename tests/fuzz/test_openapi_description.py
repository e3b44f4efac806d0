"""The worker's OpenAPI description, which the fuzzers trust: bodies from the protocol models,
the keys, and the statuses and error shapes of each family. In-process, no worker needed."""

from __future__ import annotations

import schemathesis

from tests.fuzz.worker import described
from vllmmlxd.api.openai.protocol import ChatCompletionRequest

BODY_ROUTES = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/messages/count_tokens"]


def test_every_post_route_has_its_protocol_model_as_body():
    d = described()
    for path in BODY_ROUTES:
        body = d["paths"][path]["post"]["requestBody"]
        assert body["required"] is True
        ref = body["content"]["application/json"]["schema"]["$ref"]
        assert ref.rsplit("/", 1)[1] in d["components"]["schemas"], (path, ref)
    chat = d["components"]["schemas"]["ChatCompletionRequest"]
    assert set(chat["properties"]) == set(ChatCompletionRequest.model_fields) and "messages" in chat["required"]


def test_every_route_but_health_and_metrics_requires_a_key():
    d = described()
    assert set(d["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert d["components"]["securitySchemes"]["apiKey"] == {"type": "apiKey", "in": "header", "name": "x-api-key"}
    for path, ops in d["paths"].items():
        for op in ops.values():
            if path in ("/health", "/metrics"):
                assert {} in op["security"], path  # optional: the entry may put them behind the key
            else:
                assert op["security"] == [{"bearer": []}, {"apiKey": []}], path
                assert {"401", "403", "429"} <= set(op["responses"]), path


def test_errors_are_declared_in_their_family_shape_and_numbering():
    d = described()
    chat = d["paths"]["/v1/chat/completions"]["post"]["responses"]
    messages = d["paths"]["/v1/messages"]["post"]["responses"]
    assert set(chat) == {"200", "400", "401", "403", "404", "413", "415", "422", "429", "503", "504"}
    assert set(messages) == {"200", "400", "401", "403", "404", "413", "415", "429", "504", "529"}  # no 422; 529
    assert chat["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/OpenAIError")
    assert messages["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/AnthropicError")
    assert "text/event-stream" in chat["200"]["content"]
    count = d["paths"]["/v1/messages/count_tokens"]["post"]["responses"]
    assert "text/event-stream" not in count["200"]["content"] and "504" not in count


def test_the_description_loads_as_a_schema_with_every_operation():
    schema = schemathesis.openapi.from_dict(described())
    labels = {result.ok().label for result in schema.get_all_operations()}
    assert {"POST /v1/chat/completions", "POST /v1/messages", "GET /v1/models/{model_id}", "GET /health"} <= labels
