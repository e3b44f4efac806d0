"""GPT-OSS's harmony format through every API family: a turn that reasons and calls a tool, then,
with the tool's result sent back, a turn that reasons and answers, come back as reasoning, a tool
call and text on chat completions, Responses, Anthropic Messages and Ollama's chat; streamed equal
to not streamed; and the first turn's reasoning and call are rendered back in harmony for the
second (the model answers otherwise if they are not).

The worker app runs in this process over the real engine; the model is the scripted stand-in of
tests/support/harmony.py, its tokenizer carrying harmony's special tokens.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
import uvicorn

from tests.support.harmony import (
    ANSWER,
    ARGUMENTS,
    REASONING_1,
    REASONING_2,
    RESULT,
    TOOL,
    make_tokenizer,
    scripted_model,
)
from tests.support.servers import free_port

QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    from mlx_lm.utils import load_tokenizer

    from vllmmlxd.config.schema import ResolvedModel
    from vllmmlxd.engine.loading.loader import LoadedModel
    from vllmmlxd.engine.mlx_engine import MLXEngine
    from vllmmlxd.engine.options import EngineOptions
    from vllmmlxd.worker.app import create_app

    folder = make_tokenizer(tmp_path_factory.mktemp("gpt-oss"))
    probe = load_tokenizer(folder)
    ends = [probe.convert_tokens_to_ids(t) for t in ("<|return|>", "<|call|>")]
    tokenizer = load_tokenizer(folder, eos_token_ids=ends)
    loaded = LoadedModel(scripted_model(tokenizer), tokenizer, folder, 4096, "gpt-oss")
    engine = MLXEngine(loaded, options=EngineOptions(max_num_seqs=4))
    assert engine.info.tool_parser == "harmony" and engine.info.reasoning
    app = create_app(engine, ResolvedModel(model=str(folder), enable_auto_tool_choice=True), "gpt-oss")
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)
    engine.close()


def post(url: str, path: str, body: dict) -> dict:
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def events(url: str, path: str, body: dict) -> list[dict]:
    """A streamed answer's SSE data objects, or NDJSON lines (Ollama)."""
    out = []
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            line = line.removeprefix("data: ")
            if line.startswith("{"):
                out.append(json.loads(line))
    return out


# -- OpenAI chat completions --------------------------------------------------


def chat_fold(chunks: list[dict]) -> dict:
    reasoning = content = ""
    calls: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            reasoning += delta.get("reasoning_content") or ""
            content += delta.get("content") or ""
            for call in delta.get("tool_calls") or ():
                got = calls.setdefault(call["index"], {"name": "", "arguments": ""})
                got["name"] += call["function"].get("name") or ""
                got["arguments"] += call["function"].get("arguments") or ""
    return {"reasoning": reasoning, "content": content, "calls": list(calls.values())}


def chat_whole(body: dict) -> dict:
    message = body["choices"][0]["message"]
    calls = [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
        for c in message.get("tool_calls") or ()
    ]
    return {
        "reasoning": message.get("reasoning_content") or "",
        "content": message.get("content") or "",
        "calls": calls,
    }


def test_chat_completions(url):
    first = {"messages": [{"role": "user", "content": QUESTION}], "tools": [TOOL], "temperature": 0}
    whole = post(url, "/v1/chat/completions", first)
    turn = chat_whole(whole)
    assert turn == {
        "reasoning": REASONING_1,
        "content": "",
        "calls": [{"name": "get_weather", "arguments": json.dumps(ARGUMENTS)}],
    }
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    assert chat_fold(events(url, "/v1/chat/completions", first)) == turn
    call = whole["choices"][0]["message"]["tool_calls"][0]
    second = {
        **first,
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": None, "reasoning_content": REASONING_1, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": json.dumps(RESULT)},
        ],
    }
    answer = chat_whole(post(url, "/v1/chat/completions", second))
    assert answer == {"reasoning": REASONING_2, "content": ANSWER, "calls": []}
    assert chat_fold(events(url, "/v1/chat/completions", second)) == answer


# -- OpenAI Responses ---------------------------------------------------------

RESPONSES_TOOL = {"type": "function", **TOOL["function"]}


def items(output: list[dict]) -> list[tuple]:
    """A response's output items by what they say (ids differ between two responses)."""
    out: list[tuple] = []
    for item in output:
        if item["type"] == "reasoning":
            out.append(("reasoning", "".join(p["text"] for p in item.get("summary", []) + item.get("content", []))))
        elif item["type"] == "function_call":
            out.append(("call", item["name"], item["arguments"]))
        elif item["type"] == "message":
            out.append(("text", "".join(p.get("text", "") for p in item["content"])))
    return out


def completed(stream: list[dict]) -> dict:
    return next(e["response"] for e in stream if e.get("type") == "response.completed")


def test_responses(url):
    first = {"input": QUESTION, "tools": [RESPONSES_TOOL], "temperature": 0}
    whole = post(url, "/v1/responses", first)
    assert items(whole["output"]) == [("reasoning", REASONING_1), ("call", "get_weather", json.dumps(ARGUMENTS))]
    assert items(completed(events(url, "/v1/responses", first))["output"]) == items(whole["output"])
    call = next(i for i in whole["output"] if i["type"] == "function_call")
    reasoning = next(i for i in whole["output"] if i["type"] == "reasoning")
    second = {
        **first,
        "input": [
            {"role": "user", "content": QUESTION},
            reasoning,
            call,
            {"type": "function_call_output", "call_id": call["call_id"], "output": json.dumps(RESULT)},
        ],
    }
    answer = items(post(url, "/v1/responses", second)["output"])
    assert answer == [("reasoning", REASONING_2), ("text", ANSWER)]
    assert items(completed(events(url, "/v1/responses", second))["output"]) == answer


# -- Anthropic Messages -------------------------------------------------------

ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": TOOL["function"]["parameters"],
}


def blocks(content: list[dict]) -> list[tuple]:
    out: list[tuple] = []
    for block in content:
        if block["type"] == "thinking":
            out.append(("thinking", block["thinking"]))
        elif block["type"] == "tool_use":
            out.append(("tool_use", block["name"], block["input"]))
        elif block["type"] == "text" and block["text"]:
            out.append(("text", block["text"]))
    return out


def message_fold(stream: list[dict]) -> list[tuple]:
    content: list[dict] = []
    partial: dict[int, str] = {}
    for event in stream:
        if event["type"] == "content_block_start":
            content.append(dict(event["content_block"]))
        elif event["type"] == "content_block_delta":
            block, delta = content[event["index"]], event["delta"]
            if delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
    for index, text in partial.items():
        content[index]["input"] = json.loads(text)
    return blocks(content)


def test_anthropic_messages(url):
    first = {"messages": [{"role": "user", "content": QUESTION}], "tools": [ANTHROPIC_TOOL], "max_tokens": 200}
    whole = post(url, "/v1/messages", first)
    assert blocks(whole["content"]) == [("thinking", REASONING_1), ("tool_use", "get_weather", ARGUMENTS)]
    assert whole["stop_reason"] == "tool_use"
    assert message_fold(events(url, "/v1/messages", first)) == blocks(whole["content"])
    use = next(b for b in whole["content"] if b["type"] == "tool_use")
    second = {
        **first,
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": whole["content"]},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": json.dumps(RESULT)}],
            },
        ],
    }
    answer = blocks(post(url, "/v1/messages", second)["content"])
    assert answer == [("thinking", REASONING_2), ("text", ANSWER)]
    assert message_fold(events(url, "/v1/messages", second)) == answer


# -- Ollama's chat ------------------------------------------------------------


def ollama_fold(lines: list[dict]) -> dict:
    message: dict = {"thinking": "", "content": "", "tool_calls": []}
    for line in lines:
        got = line.get("message", {})
        message["thinking"] += got.get("thinking") or ""
        message["content"] += got.get("content") or ""
        message["tool_calls"] += got.get("tool_calls") or []
    return message


def ollama_whole(body: dict) -> dict:
    got = body["message"]
    return {
        "thinking": got.get("thinking") or "",
        "content": got.get("content") or "",
        "tool_calls": got.get("tool_calls") or [],
    }


def calls_of(message: dict) -> dict:
    """The message with its calls' ids left out (each answer numbers its own)."""
    return {**message, "tool_calls": [c["function"] for c in message["tool_calls"]]}


def test_ollama_chat(url):
    first = {
        "model": "gpt-oss",
        "messages": [{"role": "user", "content": QUESTION}],
        "tools": [TOOL],
        "think": True,
        "stream": False,
    }
    whole = ollama_whole(post(url, "/ollama/api/chat", first))
    assert whole["thinking"] == REASONING_1 and whole["content"] == ""
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in whole["tool_calls"]] == [
        ("get_weather", ARGUMENTS)
    ]
    assert calls_of(ollama_fold(events(url, "/ollama/api/chat", first))) == calls_of(whole)
    second = {
        **first,
        "messages": [
            *first["messages"],
            {"role": "assistant", "content": "", "thinking": REASONING_1, "tool_calls": whole["tool_calls"]},
            {"role": "tool", "tool_name": "get_weather", "content": json.dumps(RESULT)},
        ],
    }
    answer = ollama_whole(post(url, "/ollama/api/chat", second))
    assert answer == {"thinking": REASONING_2, "content": ANSWER, "tool_calls": []}
    assert ollama_fold(events(url, "/ollama/api/chat", second)) == answer
