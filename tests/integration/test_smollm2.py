"""A real model, SmolLM2-135M-Instruct (float32), on one worker (greedy by default, prompt lookup
drafting every step) for the tests that need real answers: LangChain's ChatOpenAI (its chat
template ignores tools: a forced tool still gives a schema-valid call, with_structured_output a
valid object), Anthropic's SDK and OpenAI's Responses API naming Paris; and log-probabilities
equal to mlx-lm's own forward pass over the same tokens in this process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import anthropic
import httpx
import jsonschema
import mlx.core as mx
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
    s = start_serve(
        "builtin:smollm2-135m-instruct", "--timeout", "300", "--default-temperature", "0", "--no-adaptive-speculation"
    )
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


EDIT = "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n\n" * 2


@pytest.fixture(scope="module")
def reference(state_dir):
    """SmolLM2 loaded in this process, as the worker loads it: mlx-lm's forward is the oracle."""
    from vllmmlxd.engine.loading.loader import load_model

    return load_model("builtin:smollm2-135m-instruct", state_dir)


def forward(loaded, prompt: list[int], written: list[int]) -> mx.array:
    """Row p: the log-softmax over the vocabulary that chose written[p]."""
    logits = loaded.model(mx.array([prompt + written]))[0].astype(mx.float32)
    return (logits - mx.logsumexp(logits, axis=-1, keepdims=True))[len(prompt) - 1 : len(prompt) - 1 + len(written)]


def completion(server, prompt: list[int], **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": 16, "logprobs": 5, "return_tokens_as_token_ids": True, **extra}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def held_to(loaded, prompt: list[int], logprobs: dict) -> list[int]:
    """Each token's log-probability and its top 5 equal the reference's within 1e-4; the tokens."""
    written = [int(t.removeprefix("token_id:")) for t in logprobs["tokens"]]
    want = forward(loaded, prompt, written)
    for p, (token, value, top) in enumerate(
        zip(written, logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True)
    ):
        row = want[p]
        assert abs(value - row[token].item()) < 1e-4
        best = cast(list[float], mx.sort(row)[::-1][:5].tolist())
        assert sorted(top.values(), reverse=True) == pytest.approx(best, abs=1e-4)
        assert all(abs(v - row[int(t.removeprefix("token_id:"))].item()) < 1e-4 for t, v in top.items())
    return written


def test_logprobs_equal_the_models_forward_plain_batched_and_speculating(server, reference):
    tokenizer = reference.tokenizer
    prose = tokenizer.encode("The capital of France is")
    code = tokenizer.encode(EDIT + "def area(w, h):")
    plain = completion(server, prose, speculative=False)
    held_to(reference, prose, plain["logprobs"])
    # Beside two requests that ask for none, and drafting (the code repeats: prompt lookup lands).
    with ThreadPoolExecutor(3) as pool:
        busy = [pool.submit(completion, server, prose, logprobs=None, max_tokens=40) for _ in range(2)]
        drafted = completion(server, code, max_tokens=24)
        undrafted = completion(server, code, max_tokens=24, speculative=False)
        assert all(f.result()["logprobs"] is None for f in busy)
    assert held_to(reference, code, drafted["logprobs"]) == held_to(reference, code, undrafted["logprobs"])
    status = httpx.get(server.url + "/v1/status", timeout=30).json()
    assert status["speculative"]["accepted_tokens"] > 0, status["speculative"]  # drafts were verified and kept


def test_chat_logprobs_stream_and_whole_say_the_same(server):
    smol = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "Name a colour."}], max_tokens=8)
    whole = smol.chat.completions.create(logprobs=True, top_logprobs=3, **kw)
    content = whole.choices[0].logprobs.content
    assert "".join(c.token for c in content) == whole.choices[0].message.content
    assert all(len(c.top_logprobs) == 3 and c.top_logprobs[0].logprob >= c.logprob - 1e-6 for c in content)
    chunks = list(smol.chat.completions.create(logprobs=True, top_logprobs=3, stream=True, **kw))
    streamed = [
        c for chunk in chunks if chunk.choices and chunk.choices[0].logprobs for c in chunk.choices[0].logprobs.content
    ]
    assert [(c.token, round(c.logprob, 4)) for c in streamed] == [(c.token, round(c.logprob, 4)) for c in content]
    assert smol.chat.completions.create(**kw).choices[0].logprobs is None
    with pytest.raises(openai.BadRequestError):
        smol.chat.completions.create(top_logprobs=2, **kw)  # without logprobs: true


def test_echo_gives_the_prompts_own_logprobs_and_max_tokens_0_the_prompt_alone(server, reference):
    prompt = reference.tokenizer.encode("The capital of France is Paris.")
    both = completion(server, prompt, echo=True, max_tokens=3, speculative=False)
    alone = completion(server, [prompt], echo=True, max_tokens=0)  # a batch of one, as lm-eval sends it
    lists = both["logprobs"]
    n = len(prompt)
    assert lists["tokens"][:n] == [f"token_id:{t}" for t in prompt] and len(lists["tokens"]) == n + 3
    assert lists["token_logprobs"][0] is None and lists["top_logprobs"][0] is None  # nothing before the first
    want = forward(reference, prompt[:1], prompt[1:])
    for p, token in enumerate(prompt[1:], start=1):
        assert abs(lists["token_logprobs"][p] - want[p - 1][token].item()) < 1e-4
    held_to(reference, prompt, {k: v[n:] for k, v in lists.items()})  # then the written tokens, as without echo
    assert both["text"].startswith(reference.tokenizer.decode(prompt)) and both["finish_reason"] == "length"
    assert alone["logprobs"]["token_logprobs"] == lists["token_logprobs"][:n]
    assert alone["text"] == reference.tokenizer.decode(prompt) and alone["finish_reason"] == "length"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": prompt, "max_tokens": 0}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


CAPITALS = [
    {"country": "France", "capital": "Paris", "choices": [" Paris", " Rome", " Berlin"], "answer": 0},
    {"country": "Italy", "capital": "Rome", "choices": [" Madrid", " Rome", " Paris"], "answer": 1},
    {"country": "Germany", "capital": "Berlin", "choices": [" Vienna", " Lisbon", " Berlin"], "answer": 2},
]
TASKS = {
    # A log-likelihood task: each choice's continuation scored from the echoed prompt's log-probabilities.
    "vllmmlxd_capitals_mc": """
output_type: multiple_choice
doc_to_text: "Q: What is the capital of {{country}}?\\nA:"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
""",
    # A generation task, through chat completions.
    "vllmmlxd_capitals_gen": """
output_type: generate_until
doc_to_text: "What is the capital of {{country}}? Answer with the city's name only."
doc_to_target: "{{capital}}"
generation_kwargs: {until: ["\\n"], max_gen_toks: 12}
metric_list:
  - metric: exact_match
    ignore_case: true
    ignore_punctuation: true
""",
}


# lm-eval's Python API (simple_evaluate) in a process of its own, both tasks in one: its task
# index then holds only these files (indexing its thousands of own tasks costs 8 s of CPU a run).
LM_EVAL = """
import json, sys
import lm_eval
from lm_eval.tasks import TaskManager

url, tasks_dir = sys.argv[1], sys.argv[2]
tasks = TaskManager(include_path=tasks_dir, include_defaults=False)
runs = {
    "vllmmlxd_capitals_mc": ("local-completions", url + "/v1/completions", {}),
    "vllmmlxd_capitals_gen": ("local-chat-completions", url + "/v1/chat/completions", {"apply_chat_template": True}),
}
results = {}
for task, (model, base_url, extra) in runs.items():
    args = f"model=smollm2,base_url={base_url},num_concurrent=1,max_retries=1"
    done = lm_eval.simple_evaluate(model=model, model_args=args, tasks=[task], task_manager=tasks, **extra)
    results.update(done["results"])
print(json.dumps(results))
"""


def test_lm_evaluation_harness_runs_a_loglikelihood_and_a_generation_task(server, tmp_path):
    """As lm-eval's documentation runs a local server: local-completions (it finds the worker's
    /tokenize and /tokenizer_info itself: no tokenizer of its own) for the log-likelihood task,
    local-chat-completions with the chat template applied for the generation task; both complete,
    over all three questions, offline."""
    data = tmp_path / "capitals.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in CAPITALS))
    for name, body in TASKS.items():
        head = f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
        (tmp_path / f"{name}.yaml").write_text(head + body)
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    run = subprocess.run(
        [sys.executable, "-c", LM_EVAL, server.url, str(tmp_path)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    assert results["vllmmlxd_capitals_mc"]["sample_len"] == results["vllmmlxd_capitals_gen"]["sample_len"] == 3
    assert 0 <= results["vllmmlxd_capitals_mc"]["acc,none"] <= 1
    assert 0 <= results["vllmmlxd_capitals_gen"]["exact_match,none"] <= 1


def test_responses_logprobs_are_the_messages_tokens_streamed_and_whole(server):
    smol = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)
    kw = dict(
        model="smollm2",
        input="Name a colour.",
        max_output_tokens=8,
        include=["message.output_text.logprobs"],
        top_logprobs=2,
    )
    made = smol.responses.create(**kw)
    part = made.output[0].content[0]
    assert "".join(lp.token for lp in part.logprobs) == part.text
    assert all(len(lp.top_logprobs) == 2 for lp in part.logprobs)
    with smol.responses.stream(**kw) as stream:
        events = list(stream)
    deltas = [lp for e in events if e.type == "response.output_text.delta" for lp in e.logprobs or ()]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [lp.token for lp in deltas] == [lp.token for lp in done.logprobs] == [lp.token for lp in part.logprobs]
