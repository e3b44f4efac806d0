"""Ollama's API on the real daemon's gateway (``gateway.ollama_port``), driven by the official
``ollama`` Python client and, once, its JavaScript library: an eager builtin:tiny with an embedding
model and a lazy one. builtin:tiny has random weights, so only what holds by construction is
asserted: formats, enforcement (a schema, a forced call), routing, bounded counts, and the
equality of two paths (streamed and whole answers of one seed)."""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path

import httpx
import jsonschema
import ollama
import pytest

from tests.support.daemon import free_port, make_daemon, model_entry, wait_gone

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]
_PINNED = re.search(r"^OLLAMA_JS_VERSION = (\S+)", (REPO / "Makefile").read_text(), re.M)
assert _PINNED is not None, "the Makefile pins OLLAMA_JS_VERSION"
OLLAMA_JS_VERSION = _PINNED.group(1)
OLLAMA_JS = REPO / ".clients" / f"ollama-js-{OLLAMA_JS_VERSION}"
SEEDED = {"seed": 7, "temperature": 1.0, "num_predict": 12}
HI = [{"role": "user", "content": "Hello"}]
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}}]


class Daemon:
    def __init__(self):
        self.ports = {"gateway": free_port(), "ollama": free_port(), "tiny": free_port(), "lazy": free_port()}
        self.d = make_daemon()
        models = {
            "tiny": model_entry(
                self.ports["tiny"], aliases=["t"], cache_memory_mb=64, embedding_model="builtin:all-minilm-l6-v2"
            ),
            "lazy": model_entry(self.ports["lazy"], load="lazy", cache_memory_mb=64),
        }
        self.d.write(models, gateway={"port": self.ports["gateway"], "ollama_port": self.ports["ollama"]})
        self.d.start(env={"VLLMMLXD_HEALTH_INTERVAL_S": "1"})
        self.d.wait_for(lambda ms: ms["tiny"]["state"] == "ready" and ms["lazy"]["state"] == "unloaded", 180)
        self.d.wait_for(lambda ms: (self.d.status().get("gateway") or {}).get("state") == "ready", what="gateway")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports['ollama']}"

    def client(self) -> ollama.Client:
        return ollama.Client(host=self.url, timeout=120)


@pytest.fixture(scope="module")
def daemon():
    d = Daemon()
    yield d
    pids = d.d.worker_pids() if d.d.proc and d.d.proc.poll() is None else []
    code = d.d.stop()
    assert wait_gone(pids)
    assert code in (0, None), d.d.log()[-3000:]


def test_chat_streamed_and_whole_are_one_answer_in_ollamas_format(daemon):
    client = daemon.client()
    whole = client.chat(model="tiny", messages=HI, options=SEEDED)
    parts = list(client.chat(model="t", messages=HI, options=SEEDED, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    last = parts[-1]
    for answer in (whole, last):
        assert answer.done_reason in ("stop", "length") and 0 < answer.eval_count <= 12
        assert answer.prompt_eval_count > 0 and answer.total_duration >= answer.eval_duration > 0
        assert answer.prompt_eval_duration > 0 and answer.load_duration == 0 and answer.created_at.endswith("Z")
    assert whole.model == "tiny" and last.model == "t"


def test_logprobs_come_with_each_token_streamed_and_whole(daemon):
    client = daemon.client()
    kw = dict(model="tiny", messages=HI, options={**SEEDED, "temperature": 0}, logprobs=True, top_logprobs=2)
    whole = client.chat(**kw)
    parts = list(client.chat(**kw, stream=True))
    assert whole.logprobs is not None and len(whole.logprobs) == whole.eval_count  # one per token written
    assert "".join(e.token for e in whole.logprobs) == whole.message.content
    streamed = [e for p in parts for e in p.logprobs or ()]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [
        (e.token, round(e.logprob, 4)) for e in whole.logprobs
    ]
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token for e in whole.logprobs)  # greedy
    plain = client.generate(model="tiny", prompt="Once", raw=True, options=SEEDED)
    assert plain.logprobs is None


def test_generate_templated_and_raw(daemon):
    client = daemon.client()
    out = client.generate(model="tiny", prompt="Once", system="Be brief.", options=SEEDED)
    assert isinstance(out.response, str) and out.done and out.eval_count <= 12
    raw = client.generate(model="tiny", prompt="Once upon a time", raw=True, options=SEEDED)
    assert raw.done and raw.prompt_eval_count < out.prompt_eval_count  # no template around it
    with pytest.raises(ollama.ResponseError) as refused:
        client.generate(model="tiny", prompt="def f(", suffix="return x")
    assert refused.value.status_code == 400 and "suffix" in refused.value.error


def test_options_are_honoured(daemon):
    client = daemon.client()
    short = client.chat(model="tiny", messages=HI, options={**SEEDED, "num_predict": 3})
    assert short.eval_count <= 3 and short.done_reason == "length"
    again = client.chat(model="tiny", messages=HI, options={**SEEDED, "num_predict": 3})
    assert again.message.content == short.message.content
    text = client.generate(model="tiny", prompt="Once", raw=True, options=SEEDED).response
    stop = text[len(text) // 2 :][:3]  # a piece of what this seed writes: it ends the answer there
    cut = client.generate(model="tiny", prompt="Once", raw=True, options={**SEEDED, "stop": [stop]})
    assert cut.done_reason == "stop" and cut.response == text[: text.index(stop)]
    with pytest.raises(ollama.ResponseError) as bad:
        client.chat(model="tiny", messages=HI, options={"temperature": "hot", "no_such_option": 1})
    assert bad.value.status_code == 400 and "temperature" in bad.value.error


def test_format_holds_the_answer_to_a_schema(daemon):
    out = daemon.client().chat(model="tiny", messages=HI, format=WEATHER, options={**SEEDED, "num_predict": 80})
    assert out.done_reason == "stop"
    jsonschema.validate(json.loads(out.message.content), WEATHER)


def test_a_tool_call_round_trip(daemon):
    client = daemon.client()
    # Ollama has no tool_choice; vllmmlxd's extension forces the call a random model would not make.
    body = {"model": "tiny", "messages": HI, "tools": TOOLS, "tool_choice": "required", "stream": False}
    body["options"] = {**SEEDED, "num_predict": 60}
    asked = client._request(ollama.ChatResponse, "POST", "/api/chat", json=body)
    (call,) = asked.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(dict(call.function.arguments), WEATHER)
    history = [*HI, asked.message, {"role": "tool", "tool_name": "get_weather", "content": "12 degrees"}]
    answer = client.chat(model="tiny", messages=history, tools=TOOLS, options=SEEDED)
    assert answer.done and answer.prompt_eval_count > asked.prompt_eval_count


def test_list_show_ps_and_version(daemon):
    client = daemon.client()
    names = {m.model for m in client.list().models}
    assert {"tiny", "lazy", "all-minilm-l6-v2"} <= names
    shown = client.show("tiny")
    assert {"completion", "tools", "embedding"} <= set(shown.capabilities)
    assert shown.modelinfo["llama.context_length"] > 0 and shown.details.family == "llama" and shown.template
    loaded = {m.model: m for m in client.ps().models}
    assert "tiny" in loaded and "lazy" not in loaded and loaded["tiny"].size > 0
    assert httpx.get(daemon.url + "/api/version").json()["version"]
    assert httpx.head(daemon.url + "/").status_code == 200 and httpx.get(daemon.url).text == "Ollama is running"


def test_embed_and_embeddings(daemon):
    client = daemon.client()
    for name in ("tiny", "all-minilm-l6-v2"):
        out = client.embed(model=name, input=["Hello world", "Hi there"])
        assert len(out.embeddings) == 2 and len(out.embeddings[0]) == 384 and out.prompt_eval_count > 0
        assert all(abs(math.hypot(*v) - 1) < 1e-3 for v in out.embeddings)
    assert len(client.embeddings(model="tiny", prompt="Hello world").embedding) == 384


def test_an_unknown_model_is_ollamas_404_and_images_to_a_text_model_a_400_naming_it(daemon):
    with pytest.raises(ollama.ResponseError) as missing:
        daemon.client().chat(model="nope", messages=HI)
    assert missing.value.status_code == 404 and "not found" in missing.value.error and "tiny" in missing.value.error
    with pytest.raises(ollama.ResponseError) as refused:
        daemon.client().chat(model="tiny", messages=[{**HI[0], "images": ["aGk="]}])
    assert refused.value.status_code == 400 and "'tiny' takes text only" in refused.value.error


def test_the_main_ports_api_chat_points_ollama_clients_at_the_ollama_port(daemon):
    main = ollama.Client(host=f"http://127.0.0.1:{daemon.ports['gateway']}", timeout=30)
    with pytest.raises(ollama.ResponseError) as refused:
        main.chat(model="tiny", messages=HI, options=SEEDED)
    assert refused.value.status_code == 400 and str(daemon.ports["ollama"]) in refused.value.error


def test_keep_alive_0_unloads_a_lazy_model_after_its_request(daemon):
    out = daemon.client().chat(model="lazy", messages=HI, options={**SEEDED, "num_predict": 2}, keep_alive=0)
    assert out.done
    daemon.d.wait_for(lambda ms: ms["lazy"]["state"] == "unloaded", 60, "lazy unloaded")


def test_the_javascript_client_lists_models_and_streams_a_chat(daemon):
    if not (OLLAMA_JS / "node_modules" / "ollama").is_dir():
        pytest.fail(f"{OLLAMA_JS} is missing: `make test` (or `make clients`) installs ollama {OLLAMA_JS_VERSION}")
    script = """
    const { Ollama } = await import("ollama");
    const client = new Ollama({ host: process.argv[1] });
    const listed = await client.list();
    let text = "", done = null;
    for await (const part of await client.chat({ model: "tiny", messages: [{ role: "user", content: "Hello" }],
        stream: true, options: { seed: 7, temperature: 1, num_predict: 6 } })) {
      text += part.message.content;
      if (part.done) done = part;
    }
    console.log(JSON.stringify({ names: listed.models.map((m) => m.name), text, eval_count: done.eval_count }));
    """
    r = subprocess.run(
        ["node", "--input-type=module", "-e", script, daemon.url],
        cwd=OLLAMA_JS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "tiny" in out["names"] and 0 < out["eval_count"] <= 6
    whole = daemon.client().chat(model="tiny", messages=HI, options={**SEEDED, "num_predict": 6})
    assert out["text"] == whole.message.content
