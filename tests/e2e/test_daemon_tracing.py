"""Traces on the real daemon (OpenTelemetry over OTLP/HTTP, to a collector in this process): a chat
request with a `traceparent`, through the gateway to a worker whose MCP tool loop runs a call,
is one trace: the gateway's span under the client's, the worker's under the gateway's, the
engine's phases and the tool call under the worker's, with OpenTelemetry's generative-AI
attributes and neither the prompt nor the key; the tool call's context reaches the MCP server
in its request's _meta. With the collector gone, requests go on and the
spans that could not be sent are counted in /metrics."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.daemon import free_port, make_daemon
from tests.support.otlp import Collector

SERVER = Path(__file__).parents[1] / "support" / "mcp_servers" / "stdio_server.py"
KEY = "tracing-k3y-never-sent"
PROMPT = "add these two numbers please"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def config(d, endpoint: str, capture: bool = False) -> str:
    telemetry = {"endpoint": endpoint, "headers": {"x-collector-token": "${env:COLLECTOR_TOKEN}"}}
    return yaml.safe_dump(
        {
            "daemon": {"control_socket": str(d.socket), "state_dir": str(d.state_dir), "drain_timeout": 10},
            "telemetry": {**telemetry, "capture_content": capture},
            "mcp_servers": {"files": {"command": sys.executable, "args": [str(SERVER)]}},
            "api_keys": {"alice": {"key": KEY}},
            "gateway": {"port": d.gateway_port},
            "models": {
                "tiny": {
                    "model": "builtin:tiny",
                    "port": d.port,
                    "api_keys": ["alice"],
                    "enable_metrics": True,
                    "mcp": ["files"],
                    "mcp_auto_execute": ["files__add"],
                    "mcp_max_tool_calls": 1,
                }
            },
        }
    )


@pytest.fixture(scope="module")
def traced():
    collector = Collector().start()
    d = make_daemon()
    d.port, d.gateway_port = free_port(), free_port()
    d.write_text(config(d, collector.endpoint))
    d.start(env={"COLLECTOR_TOKEN": "collector-secret"})
    d.wait_for(
        lambda ms: ms["tiny"]["state"] == "ready" and (d.status().get("gateway") or {}).get("state") == "ready",
        what="model and gateway ready",
    )
    deadline = time.monotonic() + 60
    auth = {"Authorization": f"Bearer {KEY}"}
    url = f"http://127.0.0.1:{d.port}/v1/mcp/tools"
    while "files__add" not in str(httpx.get(url, headers=auth, timeout=10).json()):
        assert time.monotonic() < deadline, d.log()[-3000:]
        time.sleep(0.2)
    yield d, collector
    d.stop()
    collector.stop()


def chat(d, port: int, **headers: str) -> httpx.Response:
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 100,
        "temperature": 1.0,
        "seed": 7,
        "tool_choice": {"type": "function", "function": {"name": "files__add"}},
    }
    return httpx.post(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {KEY}", **headers},
        timeout=120,
    )


def test_one_trace_from_the_gateway_through_the_worker_and_its_tool_call(traced):
    d, collector = traced
    r = chat(d, d.gateway_port, traceparent=f"00-{TRACE_ID}-{CLIENT_SPAN}-01")
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["mcp_calls"][0]["function"]["name"] == "files__add"
    spans = collector.trace(TRACE_ID, {"gateway POST /v1/chat/completions", "chat tiny", "prefill", "decode"})
    by_name = {s["name"]: s for s in spans}
    gateway, worker = by_name["gateway POST /v1/chat/completions"], by_name["chat tiny"]
    assert gateway["parent_id"] == CLIENT_SPAN and worker["parent_id"] == gateway["span_id"]
    assert gateway["kind"] == worker["kind"] == 2  # SERVER
    for phase in ("queue", "prefill", "decode"):
        assert by_name[phase]["parent_id"] == worker["span_id"]
        assert worker["start"] <= by_name[phase]["start"] <= by_name[phase]["end"] <= worker["end"]
    [tool] = [s for s in spans if s["name"] == "execute_tool files__add"]
    assert tool["parent_id"] == worker["span_id"] and tool["attributes"]["gen_ai.tool.name"] == "files__add"
    usage = r.json()["usage"]
    attrs = worker["attributes"]
    assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.request.model"] == "tiny"
    assert attrs["gen_ai.usage.input_tokens"] == usage["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == usage["completion_tokens"]
    assert attrs["http.response.status_code"] == 200 and attrs["vllmmlxd.key.name"] == "alice"
    assert attrs["gen_ai.response.finish_reasons"] == [r.json()["choices"][0]["finish_reason"]]
    assert attrs["gen_ai.response.model"] == "tiny" and attrs["gen_ai.provider.name"] == "vllmmlxd"
    assert gateway["attributes"]["gen_ai.request.model"] == "tiny" and gateway["service"] == "vllmmlxd"
    sent = b"".join(collector.bodies)
    assert PROMPT.encode() not in sent and KEY.encode() not in sent and b"collector-secret" not in sent
    assert "collector-secret" not in d.log()


def test_an_mcp_call_carries_its_span_s_context_to_the_server(traced):
    d, collector = traced
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    r = httpx.post(
        f"http://127.0.0.1:{d.port}/v1/mcp/execute",
        json={"name": "files__traceparent"},
        headers={"Authorization": f"Bearer {KEY}", "traceparent": f"00-{trace_id}-b7ad6b7169203331-01"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    [tool] = [s for s in collector.trace(trace_id, {"execute_tool files__traceparent"}) if s["name"].startswith("exec")]
    assert r.json()["content"][0]["text"] == f"00-{trace_id}-{tool['span_id']}-01"  # what the server was sent


def test_content_is_in_spans_only_once_the_operator_turns_it_on(traced):
    d, collector = traced
    d.write_text(config(d, collector.endpoint, capture=True))  # a live reload: no worker restarts
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        trace_id = os.urandom(16).hex()
        r = chat(d, d.port, traceparent=f"00-{trace_id}-{CLIENT_SPAN}-01")
        assert r.status_code == 200, r.text
        [worker] = [s for s in collector.trace(trace_id, {"chat tiny"}) if s["name"] == "chat tiny"]
        if "gen_ai.input.messages" in worker["attributes"]:
            break
        time.sleep(0.5)
    else:
        raise AssertionError("capture_content never reached the worker")
    asked = json.loads(worker["attributes"]["gen_ai.input.messages"])
    assert asked == [{"role": "user", "parts": [{"type": "text", "content": PROMPT}]}]
    [answer] = json.loads(worker["attributes"]["gen_ai.output.messages"])
    assert answer["role"] == "assistant" and answer["finish_reason"] == r.json()["choices"][0]["finish_reason"]
    assert KEY.encode() not in b"".join(collector.bodies)
    d.write_text(config(d, collector.endpoint))


def test_with_the_collector_gone_requests_go_on_and_dropped_spans_are_counted(traced):
    d, collector = traced
    collector.stop()  # nothing listens there now
    before = dropped_spans(d)
    for _ in range(3):
        assert chat(d, d.port).status_code == 200
    # Five spans a request (the worker's, three phases, the tool call), each dropped once its batch's
    # export has failed (a few seconds: the exporter retries until its timeout).
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and dropped_spans(d) < before + 15:
        time.sleep(0.5)
    assert dropped_spans(d) == before + 15


def dropped_spans(d) -> float:
    metrics = httpx.get(f"http://127.0.0.1:{d.port}/metrics", timeout=10).text
    line = next(x for x in metrics.splitlines() if x.startswith("vllmmlxd_trace_spans_dropped_total"))
    return float(line.split()[-1])
