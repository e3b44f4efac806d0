"""A real model, SmolLM2-135M-Instruct, on one worker (greedy by default) for the tests that need
real answers: LangChain's ChatOpenAI (its chat template ignores tools: a forced tool still gives
a schema-valid call, with_structured_output a valid object), Anthropic's SDK and OpenAI's
Responses API naming Paris."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.servers import start_serve

pytestmark = pytest.mark.slow


class GetWeather(BaseModel):
    """Get the current weather in a city."""

    city: str = Field(description="the city, e.g. Paris")
    unit: str = Field(description="celsius or fahrenheit", json_schema_extra={"enum": ["celsius", "fahrenheit"]})


class Capital(BaseModel):
    """A country and its capital city."""

    country: str
    capital: str
    population_millions: int = Field(ge=0, le=2000)


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:smollm2-135m-instruct", "--timeout", "300", "--default-temperature", "0")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def chat(server):
    langchain_openai = pytest.importorskip("langchain_openai")  # the dev extra installs it
    return langchain_openai.ChatOpenAI(
        base_url=server.url + "/v1", api_key="x", model="smollm2", max_tokens=80, max_retries=0, timeout=300
    )


def test_bind_tools_with_a_forced_tool_returns_a_valid_call(chat):
    msg = chat.bind_tools([GetWeather], tool_choice="GetWeather").invoke("What's the weather in Paris?")
    [call] = msg.tool_calls
    assert call["name"] == "GetWeather"
    jsonschema.validate(call["args"], GetWeather.model_json_schema())


def test_with_structured_output_returns_a_valid_object(chat):
    got = chat.with_structured_output(Capital).invoke("What is the capital of France?")
    assert isinstance(got, Capital)
    jsonschema.validate(got.model_dump(), Capital.model_json_schema())


def test_anthropics_sdk_names_paris_streamed_and_not(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="not-needed", max_retries=0, timeout=300)
    question = [{"role": "user", "content": "What is the capital of France?"}]
    m = client.messages.create(
        model="claude-sonnet-4-5", max_tokens=40, messages=question, extra_body={"temperature": 0}
    )
    assert "Paris" in m.content[0].text and m.stop_reason == "end_turn"
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=40, messages=question, extra_body={"temperature": 0}
    ) as st:
        assert "".join(st.text_stream) == m.content[0].text


def test_the_responses_api_answers_streams_continues_and_holds_a_schema(server):
    """A real answer, the same streamed, carried over three turns (each served from the prefix
    cache after the first), and a schema-valid object."""
    smol = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    kw = dict(model="smollm2", input="What is the capital of France?", max_output_tokens=40)
    made = smol.responses.create(**kw)
    assert "Paris" in made.output_text and made.status == "completed"
    with smol.responses.stream(**kw) as stream:
        assert stream.get_final_response().output_text == made.output_text
    second = smol.responses.create(
        model="smollm2", input="And of Italy?", previous_response_id=made.id, max_output_tokens=30
    )
    third = smol.responses.create(
        model="smollm2", input="Thanks.", previous_response_id=second.id, max_output_tokens=10
    )
    for earlier, later in ((made, second), (second, third)):
        assert later.usage.input_tokens_details.cached_tokens >= earlier.usage.input_tokens
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}},
        "required": ["city"],
        "additionalProperties": False,
    }
    shaped = smol.responses.create(
        model="smollm2",
        input="Name the capital of France as JSON.",
        text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}},
        max_output_tokens=40,
    )
    assert set(json.loads(shaped.output_text)) == {"city"}
