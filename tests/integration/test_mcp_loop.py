"""The server-side tool loop on a real worker (builtin:tiny, random weights) with a real MCP server
(tests/support/mcp_servers/stdio_server.py, over stdio), through both API families with the
official SDKs, streamed and not.

A forced choice of an auto-executed MCP tool makes even this model call it; the worker runs the
call, feeds the result back, and the model goes on in the same response until max_tokens. The
worker starts with ``--mcp-config`` and gets ``mcp_auto_execute`` as the daemon gives live
settings: pushed over its private socket.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.support.servers import free_port, start_serve
from vllmmlxd.config.schema import ResolvedModel
from vllmmlxd.supervisor.live import push_settings

MODEL = "builtin:tiny"
SERVER = Path(__file__).parents[1] / "support" / "mcp_servers" / "stdio_server.py"
ASK = [{"role": "user", "content": "add"}]
# Seeds under which this random model writes a complete call well within max_tokens (found by trying).
SAMPLING = {"temperature": 1.0, "seed": 7}
MAX_TOKENS = 100
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 8}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


@pytest.fixture(scope="module")
def server():
    folder = Path(tempfile.mkdtemp(prefix="vllmmlxd-loop-"))
    mcp_file = folder / "mcp.json"
    mcp_file.write_text(json.dumps({"mcpServers": {"files": {"command": sys.executable, "args": [str(SERVER)]}}}))
    sock, port = folder / "w.sock", free_port()
    s = start_serve(
        MODEL, "--mcp-config", str(mcp_file), "--health-socket", str(sock), "--timeout", "120", port=port, threads=None
    )
    try:
        config = ResolvedModel(
            model=MODEL,
            served_model_name=MODEL,
            port=port,
            timeout=120,
            mcp_config=str(mcp_file),
            mcp_auto_execute=("files__add", "files__f*"),
            mcp_max_tool_calls=2,
        )
        ok, detail = asyncio.run(push_settings(sock, config))
        assert ok and detail == config.config_hash(), detail
        deadline = time.monotonic() + 60
        while "files__add" not in [t["name"] for t in httpx.get(s.url + "/v1/mcp/tools").json()["data"]]:
            assert time.monotonic() < deadline, s.log()[-3000:]
            time.sleep(0.2)
        yield s
    finally:
        assert s.stop() == 0, s.log()[-3000:]
    log = s.log()
    assert "mcp.execute" in log and '"a":' not in log  # each execution logged, never its arguments


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def ant(server):
    return anthropic.Anthropic(base_url=server.url, api_key="x", max_retries=0, timeout=120)


def forced(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


def check_add(arguments: dict, result: str) -> None:
    # The real server added the model's numbers: the call reached it and its answer came back.
    assert int(result) == arguments["a"] + arguments["b"]


def test_openai_runs_the_call_and_answers_on_streamed_and_not(oai):
    kw = dict(model="m", messages=ASK, max_tokens=MAX_TOKENS, tool_choice=forced("files__add"), extra_body=SAMPLING)
    r = oai.chat.completions.create(**kw)
    choice = r.choices[0]
    # The call was the worker's: no tool_calls for the client, and the model went on to max_tokens.
    assert choice.finish_reason == "length" and choice.message.tool_calls is None, choice
    assert r.usage.completion_tokens == MAX_TOKENS
    [executed] = choice.message.model_extra["mcp_calls"]
    assert executed["id"].startswith("call_") and executed["function"]["name"] == "files__add"
    assert executed["result"]["is_error"] is False
    check_add(json.loads(executed["function"]["arguments"]), executed["result"]["content"])
    # The next turn saw the call and its result: its prompt is longer than the first one alone.
    alone = oai.chat.completions.create(model="m", messages=ASK, max_tokens=1, extra_body=SAMPLING)
    assert r.usage.prompt_tokens > 2 * alone.usage.prompt_tokens

    chunks = list(oai.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    merged: dict[int, dict] = {}
    for c in chunks:
        for entry in (c.choices[0].delta.model_extra or {}).get("mcp_calls", []) if c.choices else []:
            merged.setdefault(entry["index"], {}).update({k: v for k, v in entry.items() if k != "index"})
    assert not any(c.choices and c.choices[0].delta.tool_calls for c in chunks)

    # The same seed: the stream ran the same call, got the same result and wrote the same answer.
    def without_id(calls):  # ids are per response
        return [{k: v for k, v in c.items() if k != "id"} for c in calls]

    assert without_id(merged.values()) == without_id(choice.message.model_extra["mcp_calls"])
    assert text == choice.message.content and all(c["id"].startswith("call_") for c in merged.values())
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["length"]
    assert chunks[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_openai_stream_helper_and_a_tool_error_fed_back(oai):
    kw = dict(model="m", messages=ASK, max_tokens=MAX_TOKENS, tool_choice=forced("files__fail"), extra_body=SAMPLING)
    with oai.chat.completions.stream(**kw) as stream:
        for _ in stream:  # the helper merges deltas; its get_final_completion refuses a "length" finish
            pass
        final = stream.current_completion_snapshot
    [executed] = final.choices[0].message.model_extra["mcp_calls"]
    # The tool's own failure is the call's result, told to the model; the request still succeeds.
    assert executed["result"]["is_error"] is True and "failed on purpose" in executed["result"]["content"]
    assert final.choices[0].finish_reason == "length" and not final.choices[0].message.tool_calls


def test_a_client_tool_call_still_goes_to_the_client(oai):
    r = oai.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER],
        tool_choice=forced("get_weather"),
        max_tokens=MAX_TOKENS,
        extra_body={"temperature": 1.0, "seed": 1},
    )
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls[0].function.name == "get_weather"
    assert "mcp_calls" not in (choice.message.model_extra or {})


def test_anthropic_shows_server_tool_use_and_its_result_streamed_and_not(ant):
    body = dict(
        model="m",
        max_tokens=MAX_TOKENS,
        messages=ASK,
        tool_choice={"type": "tool", "name": "files__add"},
        extra_body=SAMPLING,
    )
    m = ant.messages.create(**body)
    kinds = [b.type for b in m.content]
    assert kinds[:2] == ["server_tool_use", "mcp_tool_result"] and "tool_use" not in kinds, m
    use, result = m.content[0], m.content[1]
    assert use.id.startswith("srvtoolu_") and use.name == "files__add" and result.tool_use_id == use.id
    assert result.is_error is False
    check_add(use.input, result.content[0]["text"])
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == MAX_TOKENS
    with ant.messages.stream(**body) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == kinds
    assert (final.content[0].input, final.content[1].content) == (use.input, result.content)
    assert final.usage.input_tokens == m.usage.input_tokens and final.stop_reason == "max_tokens"
    # Sent back in the history, as agents do, the blocks are accepted.
    history = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump(warnings=False) for b in m.content]},
        {"role": "user", "content": "thanks"},
    ]
    again = ant.messages.create(model="m", max_tokens=4, messages=history, extra_body=SAMPLING)
    assert again.stop_reason in ("end_turn", "max_tokens")


def test_a_turn_without_calls_is_answered_as_usual(oai, server):
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 3, **SAMPLING}, timeout=60)
    assert r.status_code == 200 and "mcp_calls" not in r.json()["choices"][0]["message"]


def test_the_responses_api_shows_the_workers_call_as_an_mcp_call_item_streamed_and_not(oai):
    kw = dict(
        model="m",
        input="add",
        max_output_tokens=MAX_TOKENS,
        tool_choice={"type": "function", "name": "files__add"},
        extra_body=SAMPLING,
    )
    made = oai.responses.create(**kw)
    kinds = [item.type for item in made.output]
    # The worker ran the call: an mcp_call with the server's result, no function_call for the client.
    assert kinds[0] == "mcp_call" and "function_call" not in kinds, made.output
    call = made.output[0]
    assert (call.server_label, call.name, call.error) == ("files", "add", None)
    check_add(json.loads(call.arguments), call.output)
    assert made.status == "incomplete" and made.usage.output_tokens == MAX_TOKENS  # it went on writing
    with oai.responses.stream(**kw) as stream:
        events = list(stream)
    added = [e.item for e in events if e.type == "response.output_item.done"]
    assert [i.type for i in added] == kinds and added[0].output == call.output
    assert events[-1].type == "response.incomplete" and events[-1].response.output_text == made.output_text
