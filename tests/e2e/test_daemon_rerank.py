"""A reranking entry on the real daemon, called through the gateway by its model name with keys
and scopes: alice's key may use it, bob's may not (his scope is other models), no key is refused;
the scores are the worker's own."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.test_daemon_gateway import stop_daemon
from tests.support.daemon import free_port, make_daemon

pytestmark = pytest.mark.timeout(300)
ALICE, BOB = "sk-alice-rerank", "sk-bob-rerank"
DOCS = ["llamas live in the Andes", "Paris is in France", "vicuñas graze high up"]


def test_rerank_and_score_through_the_gateway_by_model_name_with_keys_and_scopes():
    d = make_daemon()
    gateway_port, port = free_port(), free_port()
    keys = {"alice": {"key": ALICE, "models": ["rr"]}, "bob": {"key": BOB, "models": ["chat-*"]}}
    d.write(
        {"rr": {"model": "builtin:tiny-reranker", "port": port, "served_model_name": "my-reranker", "api_keys": ["*"]}},
        api_keys=keys,
        gateway={"port": gateway_port},
    )
    d.start(env={"VLLMMLXD_HEALTH_INTERVAL_S": "1"})
    try:
        d.wait_for(lambda ms: ms["rr"]["state"] == "ready", 180, "reranker ready")
        d.wait_for(lambda ms: (d.status().get("gateway") or {}).get("state") == "ready", what="gateway")
        gateway = f"http://127.0.0.1:{gateway_port}"

        def call(path: str, body: dict, key: str | None) -> httpx.Response:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            return httpx.post(gateway + path, json=body, headers=headers, timeout=60)

        body = {"model": "my-reranker", "query": "where do llamas live?", "documents": DOCS, "top_n": 2}
        r = call("/v1/rerank", body, ALICE)
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "my-reranker" and len(r.json()["results"]) == 2
        direct = httpx.post(
            f"http://127.0.0.1:{port}/v1/rerank", json=body, headers={"Authorization": f"Bearer {ALICE}"}, timeout=60
        )
        assert r.json()["results"] == direct.json()["results"]
        score = call("/v1/score", {"model": "my-reranker", "text_1": "llamas", "text_2": DOCS}, ALICE)
        assert score.status_code == 200 and len(score.json()["data"]) == 3
        assert call("/v1/rerank", body, None).status_code == 401
        refused = call("/v1/rerank", body, BOB)
        assert refused.status_code == 403, refused.text
        assert call("/v1/rerank", {**body, "model": "no-such-model"}, ALICE).status_code == 404
    finally:
        stop_daemon(d)
