"""POST /v1/rerank and /v1/score on real workers: `vllmmlxd serve builtin:tiny-reranker` (a BERT
cross-encoder, random weights) checked against an independent numpy forward of the same folder
(tests/support/rerank_reference.py), the request shapes Open WebUI and vLLM's clients send, the
limits answered 4xx with the worker still serving; and an LLM reranker (`--task rerank` on a
random-weight Qwen3 folder) checked against mlx-lm's forward of Qwen3-Reranker's prompt."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load as mlx_lm_load

from tests.support.families import save
from tests.support.rerank_reference import ReferenceCrossEncoder
from tests.support.servers import start_serve
from vllmmlxd.engine.loading.builtin import ensure_builtin
from vllmmlxd.engine.rerank.llm_reranker import PREFIX, SUFFIX, user_text
from vllmmlxd.paths import default_state_dir

QUERY = "where do llamas live?"
DOCS = [
    "The llama is a domesticated camelid from South America.",
    "Paris is the capital of France.",
    "Guanacos and vicuñas live high in the Andes.",
    "Stock prices fell on Tuesday.",
]
KEY = "sk-rerank-test"


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny-reranker", "--served-model-name", "reranker", "--api-key", KEY, "--enable-metrics")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


@pytest.fixture(scope="module")
def reference():
    return ReferenceCrossEncoder(ensure_builtin("tiny-reranker", default_state_dir()))


def post(server, path: str, body: dict, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(server.url + path, json=body, headers=headers, timeout=60)


def test_rerank_scores_equal_the_reference_forward_sorted_with_documents(server, reference):
    r = post(server, "/v1/rerank", {"model": "reranker", "query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "model", "usage", "results"} and body["model"] == "reranker"
    assert body["id"].startswith("rerank-") and body["usage"]["total_tokens"] > 0
    want = [reference.score(QUERY, d) for d in DOCS]
    results = body["results"]
    assert [x["index"] for x in results] == sorted(range(len(DOCS)), key=lambda i: -want[i])
    for x in results:
        assert x["relevance_score"] == pytest.approx(want[x["index"]], abs=1e-4)
        assert x["document"] == {"text": DOCS[x["index"]]}  # return_documents defaults to true, as in vLLM


def test_what_open_webui_sends_is_answered_as_it_reads_it(server, reference):
    # Open WebUI's ExternalReranker: model, query, documents, top_n=len(documents); it reads results' index and score.
    r = post(server, "/v1/rerank", {"model": "reranker", "query": QUERY, "documents": DOCS, "top_n": len(DOCS)})
    by_index = sorted(r.json()["results"], key=lambda x: x["index"])
    assert [x["relevance_score"] for x in by_index] == pytest.approx(
        [reference.score(QUERY, d) for d in DOCS], abs=1e-4
    )


def test_top_n_return_documents_and_document_objects(server):
    body = {"query": QUERY, "documents": [{"text": d} for d in DOCS], "top_n": 2, "return_documents": False}
    results = post(server, "/v2/rerank", body).json()["results"]
    full = post(server, "/rerank", {"query": QUERY, "documents": DOCS}).json()["results"]
    assert len(results) == 2 and all(set(x) == {"index", "relevance_score"} for x in results)
    assert [x["index"] for x in results] == [x["index"] for x in full[:2]]


def test_score_pairs_one_text_1_with_each_text_2_or_item_by_item(server, reference):
    one = post(server, "/v1/score", {"model": "reranker", "text_1": QUERY, "text_2": DOCS}).json()
    assert one["object"] == "list" and one["id"].startswith("score-") and isinstance(one["created"], int)
    assert [d["index"] for d in one["data"]] == list(range(4)) and one["data"][0]["object"] == "score"
    assert [d["score"] for d in one["data"]] == pytest.approx([reference.score(QUERY, d) for d in DOCS], abs=1e-4)
    queries = [QUERY, "capital of France", QUERY, "markets"]
    pairs = post(server, "/score", {"text_1": queries, "text_2": DOCS}).json()
    want = [reference.score(q, d) for q, d in zip(queries, DOCS)]
    assert [d["score"] for d in pairs["data"]] == pytest.approx(want, abs=1e-4)
    assert pairs["usage"]["prompt_tokens"] == pairs["usage"]["total_tokens"] > 0


def test_a_long_document_is_cut_to_the_limit_unless_the_request_says_not(server, reference):
    long_doc = "llamas " * 300
    r = post(server, "/v1/rerank", {"query": QUERY, "documents": [long_doc]})
    assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == 128
    assert r.json()["results"][0]["relevance_score"] == pytest.approx(reference.score(QUERY, long_doc, 128), abs=1e-4)
    r = post(server, "/v1/rerank", {"query": QUERY, "documents": ["short", long_doc], "truncate": False})
    assert r.status_code == 400 and "documents[1]" in r.json()["error"]["message"]
    assert r.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    "path,body,status,words",
    [
        ("/v1/rerank", {"query": QUERY, "documents": []}, 400, "must not be empty"),
        ("/v1/rerank", {"query": QUERY, "documents": ["ok", 3]}, 400, "documents[1]"),
        ("/v1/rerank", {"query": QUERY, "documents": [{"txt": "x"}]}, 400, "documents[0]"),
        ("/v1/rerank", {"query": QUERY, "documents": ["x"] * 1001}, 400, "at most 1000"),
        ("/v1/rerank", {"query": QUERY, "documents": ["x"], "top_n": -1}, 400, "top_n"),
        ("/v1/rerank", {"query": "word " * 200, "documents": ["x"]}, 400, "no room"),
        ("/v1/rerank", {"documents": ["x"]}, 422, "query"),
        ("/v1/score", {"text_1": ["a", "b"], "text_2": ["x", "y", "z"]}, 400, "as many as text_2"),
        ("/v1/score", {"text_1": "a", "text_2": []}, 400, "must not be empty"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, 400, "reranking only"),
    ],
)
def test_client_mistakes_are_4xx_in_openais_shape(server, path, body, status, words):
    r = post(server, path, body)
    assert r.status_code == status, r.text
    assert words in r.json()["error"]["message"] and r.json()["error"]["type"] == "invalid_request_error"


def test_concurrent_requests_each_get_their_own_scores(server):
    bodies = [{"query": f"{QUERY} {i}", "documents": DOCS[i % 4 :] + DOCS[: i % 4]} for i in range(8)]
    alone = [post(server, "/v1/rerank", b).json()["results"] for b in bodies]
    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda b: post(server, "/v1/rerank", b).json()["results"], bodies))
    for a, t in zip(alone, together):
        assert [x["index"] for x in t] == [x["index"] for x in a]
        assert [x["relevance_score"] for x in t] == pytest.approx([x["relevance_score"] for x in a], abs=1e-5)


def test_keys_apply_and_the_worker_lives_on_with_its_counters(server):
    assert post(server, "/v1/rerank", {"query": QUERY, "documents": DOCS}, key=None).status_code == 401
    assert post(server, "/v1/score", {"text_1": "a", "text_2": "b"}, key="wrong").status_code == 401

    def status() -> dict:
        return httpx.get(server.url + "/v1/status", headers={"Authorization": f"Bearer {KEY}"}).json()["rerank"]

    before = status()
    assert post(server, "/v1/rerank", {"query": QUERY, "documents": ["x"] * 1001}).status_code == 400
    assert post(server, "/v1/rerank", {"query": QUERY, "documents": DOCS}).status_code == 200
    after = status()
    assert after["model"] == "tiny-reranker" and after["kind"] == "cross-encoder" and after["max_tokens"] == 128
    assert (after["requests"] - before["requests"], after["pairs"] - before["pairs"]) == (1, 4)
    assert after["errors"] == 0 and after["waiting"] == 0
    metrics = httpx.get(server.url + "/metrics").text
    assert f'vllmmlxd_rerank_pairs_total{{model="reranker"}} {float(after["pairs"])}' in metrics


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    tiny = ensure_builtin("tiny", default_state_dir())
    return save("qwen3", "float32", tmp_path_factory.mktemp("qr") / "qwen3-reranker", tokenizer_from=tiny)


def test_an_llm_reranker_worker_scores_as_mlx_lm_forward(qwen3):
    s = start_serve(str(qwen3), "--task", "rerank", "--served-model-name", "qwen-rr")
    try:
        r = httpx.post(s.url + "/v1/rerank", json={"query": QUERY, "documents": DOCS, "top_n": 3}, timeout=60)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        status = httpx.get(s.url + "/v1/status").json()["rerank"]
    finally:
        assert s.stop() == 0, s.log()[-3000:]
    model, tokenizer = mlx_lm_load(str(qwen3))[:2]
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    want = []
    for doc in DOCS:
        ids = tokenizer.encode(PREFIX, add_special_tokens=False) + tokenizer.encode(
            user_text(QUERY, doc), add_special_tokens=False
        )
        ids += tokenizer.encode(SUFFIX, add_special_tokens=False)
        last = model(mx.array([ids]))[0, -1]
        want.append(float(mx.softmax(mx.stack([last[no], last[yes]]))[1]))
    assert [x["index"] for x in results] == [int(i) for i in np.argsort(-np.array(want), kind="stable")[:3]]
    for x in results:
        assert np.log(x["relevance_score"]) == pytest.approx(np.log(want[x["index"]]), abs=1e-4)
    assert status["kind"] == "llm" and status["score"] == "yes-no softmax"
