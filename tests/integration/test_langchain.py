"""LangChain's ChatOpenAI against a real worker on SmolLM2-135M, whose chat template ignores
tools: a forced tool gives a schema-valid call and with_structured_output a valid object."""

from __future__ import annotations

import jsonschema
import pytest
from pydantic import BaseModel, Field

from tests.support.servers import start_serve

langchain_openai = pytest.importorskip("langchain_openai")  # the dev extra installs it

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
def chat():
    s = start_serve("builtin:smollm2-135m-instruct", "--timeout", "300", "--default-temperature", "0")
    try:
        yield langchain_openai.ChatOpenAI(
            base_url=s.url + "/v1", api_key="x", model="smollm2", max_tokens=80, max_retries=0, timeout=300
        )
    finally:
        assert s.stop() == 0, s.log()[-3000:]


def test_bind_tools_with_a_forced_tool_returns_a_valid_call(chat):
    msg = chat.bind_tools([GetWeather], tool_choice="GetWeather").invoke("What's the weather in Paris?")
    [call] = msg.tool_calls
    assert call["name"] == "GetWeather"
    jsonschema.validate(call["args"], GetWeather.model_json_schema())


def test_with_structured_output_returns_a_valid_object(chat):
    got = chat.with_structured_output(Capital).invoke("What is the capital of France?")
    assert isinstance(got, Capital)
    jsonschema.validate(got.model_dump(), Capital.model_json_schema())
