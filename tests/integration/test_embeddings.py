"""POST /v1/embeddings on real workers, with the official openai SDK: an embeddings-only entry
(`vllmmlxd serve builtin:all-minilm-l6-v2`) and a generation entry with `--embedding-model`.
The vectors are checked against sentence-transformers' cosines for all-MiniLM-L6-v2."""

from __future__ import annotations

import base64
import concurrent.futures as cf

import httpx
import numpy as np
import openai
import pytest

from tests.support.servers import start_serve

MODEL = "all-minilm-l6-v2"
TEXTS = ["Hello world", "Hi there, world!", "The stock market crashed today."]


@pytest.fixture(scope="module")
def only():
    s = start_serve(f"builtin:{MODEL}", "--served-model-name", "embedder", "--enable-metrics")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def both():
    s = start_serve(
        "builtin:tiny",
        "--embedding-model",
        f"builtin:{MODEL}",
        "--served-model-name",
        "tiny-chat",
        "--strict-model-name",
        "--timeout",
        "60",
    )
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def sdk(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="not-needed", max_retries=0, timeout=60)


def vectors(response) -> np.ndarray:
    return np.array([d.embedding for d in sorted(response.data, key=lambda d: d.index)])


def check_published_values(v: np.ndarray) -> None:
    assert v.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] == pytest.approx(0.688, abs=0.01)
    assert v[0] @ v[2] == pytest.approx(0.099, abs=0.01)


def test_sdk_default_base64_gives_the_published_vectors(only):
    r = sdk(only).embeddings.create(model=MODEL, input=TEXTS)  # the SDK asks for base64 and decodes it
    check_published_values(vectors(r))
    # [CLS] + tokens + [SEP]: 4 + 7 + 8
    assert (r.usage.prompt_tokens, r.usage.total_tokens) == (19, 19)
    assert r.model == "embedder"


def test_explicit_float_and_raw_base64_agree(only):
    r = sdk(only).embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    check_published_values(vectors(r))
    raw = httpx.post(only.url + "/v1/embeddings", json={"input": "Hello world", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_allclose(decoded, vectors(r)[0], atol=1e-6)


def test_token_ids_model_omitted_and_the_own_dimension(only):
    body = {"input": [[101, 7592, 2088, 102], [101, 7592, 2088, 102]], "dimensions": 384, "encoding_format": "float"}
    r = httpx.post(only.url + "/v1/embeddings", json=body).json()
    text = sdk(only).embeddings.create(model=MODEL, input="Hello world", encoding_format="float")
    np.testing.assert_allclose(r["data"][1]["embedding"], text.data[0].embedding, atol=1e-5)
    assert r["usage"]["prompt_tokens"] == 8 and r["object"] == "list" and r["data"][0]["object"] == "embedding"


@pytest.mark.parametrize(
    "body,status,words",
    [
        ({"input": []}, 400, "must not be empty"),
        ({"input": ""}, 400, "empty string"),
        ({"input": ["fine", ""]}, 400, "input[1] is an empty string"),
        ({"input": ["text", 3]}, 400, "items of one kind"),
        ({"input": [{"text": "x"}]}, 400, "must be a string"),
        ({"input": [[]]}, 400, "empty list of token ids"),
        ({"input": [101, 999999]}, 400, "inside the vocabulary"),
        ({"input": "word " * 300}, 400, "at most 256"),
        ({"input": "hi", "dimensions": 128}, 400, "dimensions"),
        ({"input": "hi", "encoding_format": "int8"}, 400, "encoding_format"),
        ({}, 422, "input"),
    ],
)
def test_bad_inputs_get_openai_errors(only, body, status, words):
    r = httpx.post(only.url + "/v1/embeddings", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"


def test_truncate_cuts_a_long_input_to_the_limit(only):
    r = httpx.post(only.url + "/v1/embeddings", json={"input": "word " * 300, "truncate": True})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == 256


def test_the_sdk_raises_bad_request_for_a_too_long_input(only):
    with pytest.raises(openai.BadRequestError) as err:
        sdk(only).embeddings.create(model=MODEL, input=["ok", "word " * 300])
    assert err.value.body["code"] == "context_length_exceeded"


def test_an_embeddings_only_entry_refuses_generation(only):
    for path, body in (
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"prompt": [1, 2, 3]}),
        ("/v1/messages", {"model": "x", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    ):
        r = httpx.post(only.url + path, json=body)
        assert r.status_code == 400 and "embeddings only" in r.text, (path, r.text)
    assert [m.id for m in sdk(only).models.list().data] == ["embedder"]


def test_64_inputs_are_a_few_batches_and_status_and_metrics_count_them(only):
    before = httpx.get(only.url + "/v1/status").json()["embedding"]
    texts = [f"sentence number {i} is about {'cats ' * (i % 9)}and dogs" for i in range(64)]
    r = sdk(only).embeddings.create(model=MODEL, input=texts)
    assert len(r.data) == 64 and [d.index for d in r.data] == list(range(64))
    after = httpx.get(only.url + "/v1/status").json()["embedding"]
    assert after["model"] == MODEL and after["dimensions"] == 384
    assert after["inputs"] - before["inputs"] == 64 and after["requests"] - before["requests"] == 1
    assert 1 <= after["batches"] - before["batches"] <= 4
    metrics = httpx.get(only.url + "/metrics").text
    assert f'vllmmlxd_embedding_inputs_total{{model="embedder"}} {float(after["inputs"])}' in metrics
    assert f'vllmmlxd_embedding_requests_total{{model="embedder"}} {float(after["requests"])}' in metrics


def test_a_generation_entry_serves_embeddings_beside_chat(both):
    client = sdk(both)
    chat = client.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert chat.choices[0].message.content is not None
    check_published_values(vectors(client.embeddings.create(model=MODEL, input=TEXTS)))
    status = httpx.get(both.url + "/v1/status").json()
    assert status["model"] == "tiny-chat" and status["embedding"]["model"] == MODEL


def test_models_lists_the_embedding_model_beside_the_generation_model(both, only):
    client = sdk(both)
    assert [m.id for m in client.models.list().data] == ["tiny-chat", MODEL]
    assert client.models.retrieve(MODEL).id == MODEL and client.models.retrieve("tiny-chat").id == "tiny-chat"
    assert [m.id for m in sdk(only).models.list().data] == ["embedder"]  # embeddings-only: one model


def test_strict_model_name_wants_the_embedding_models_name(both):
    with pytest.raises(openai.NotFoundError):
        sdk(both).embeddings.create(model="text-embedding-3-small", input="hi")


def test_generation_and_embeddings_run_together(both):
    client = sdk(both)

    def generate():
        return client.completions.create(
            model="tiny-chat", prompt="Once upon a time", max_tokens=48, extra_body={"ignore_eos": True}
        )

    def embed():
        return client.embeddings.create(model=MODEL, input=[f"text {i} " * 6 for i in range(64)])

    with cf.ThreadPoolExecutor(4) as pool:
        gens = [pool.submit(generate) for _ in range(2)]
        embeds = [pool.submit(embed) for _ in range(2)]
        assert all(g.result().usage.completion_tokens == 48 for g in gens)
        assert all(len(e.result().data) == 64 for e in embeds)


def test_an_entry_without_an_embedding_model_says_so():
    s = start_serve("builtin:tiny")
    try:
        r = httpx.post(s.url + "/v1/embeddings", json={"input": "hi"})
        assert r.status_code == 404 and "serves no embedding model" in r.json()["error"]["message"]
    finally:
        assert s.stop() == 0
