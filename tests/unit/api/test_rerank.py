"""The rerank and score routes' pure parts: documents, ordering, top_n, pairing and the response
shapes, checked against the fields vLLM's RerankResponse / ScoreResponse and Cohere's rerank
results carry (what Open WebUI, LangChain and Dify read)."""

from __future__ import annotations

import numpy as np
import pytest

from vllmmlxd.api.rerank import (
    MAX_DOCUMENTS,
    RerankRequest,
    parse_documents,
    ranking,
    rerank_body,
    score_body,
    score_groups,
)
from vllmmlxd.errors import InvalidRequest

# vLLM's protocol: RerankResponse(id, model, usage{total_tokens}, results[index, document{text}, relevance_score]);
# ScoreResponse(id, object="list", created, model, data[index, object="score", score], usage).
RERANK_FIELDS, RESULT_FIELDS = {"id", "model", "usage", "results"}, {"index", "relevance_score"}
SCORE_FIELDS, DATUM_FIELDS = {"id", "object", "created", "model", "data", "usage"}, {"index", "object", "score"}


def test_documents_are_strings_or_objects_with_text():
    assert parse_documents(["a", {"text": "b", "title": "t"}, ""]) == ["a", "b", ""]
    for bad, where in (([], "must not be empty"), (["a", 1], "documents[1]"), ([{"body": "x"}], "documents[0]")):
        with pytest.raises(InvalidRequest) as err:
            parse_documents(bad)
        assert where in err.value.message
    with pytest.raises(InvalidRequest, match="at most"):
        parse_documents(["x"] * (MAX_DOCUMENTS + 1))


def test_ranking_is_by_score_descending_ties_in_input_order_cut_at_top_n():
    scores = np.array([0.2, 0.9, 0.5, 0.9])
    assert ranking(scores, None) == [1, 3, 2, 0]
    assert ranking(scores, 0) == [1, 3, 2, 0]  # vLLM: top_n 0 is every document
    assert ranking(scores, 2) == [1, 3] and ranking(scores, 10) == [1, 3, 2, 0]


def test_rerank_body_has_vllms_and_cohere_fields():
    body = rerank_body("rerank-1", "m", ["a", "b", "c"], np.array([0.1, 0.7, 0.4], np.float32), 2, True, 12)
    assert set(body) == RERANK_FIELDS and body["usage"]["total_tokens"] == 12
    assert [r["index"] for r in body["results"]] == [1, 2]
    assert all(set(r) == RESULT_FIELDS | {"document"} for r in body["results"])
    assert body["results"][0]["document"] == {"text": "b"} and isinstance(body["results"][0]["relevance_score"], float)
    bare = rerank_body("rerank-1", "m", ["a"], np.array([0.3]), None, False, 3)
    assert set(bare["results"][0]) == RESULT_FIELDS


def test_return_documents_defaults_to_true_and_truncation_to_on():
    req = RerankRequest.model_validate({"query": "q", "documents": ["d"]})
    assert req.return_documents is True and req.cuts() is True and req.top_n is None
    assert RerankRequest.model_validate({"query": "q", "documents": [], "truncation": False}).cuts() is False
    assert RerankRequest.model_validate({"query": "q", "documents": [], "truncate": False}).cuts() is False


def test_score_pairs_one_first_text_with_all_or_item_by_item():
    assert score_groups("q", ["a", "b"]) == [("q", [0, 1])]
    assert score_groups(["q"], "a") == [("q", [0])]
    assert score_groups(["q", "r", "q"], ["a", "b", "c"]) == [("q", [0, 2]), ("r", [1])]
    with pytest.raises(InvalidRequest, match="as many as text_2"):
        score_groups(["q", "r"], ["a", "b", "c"])
    with pytest.raises(InvalidRequest, match="must not be empty"):
        score_groups([], ["a"])


def test_score_body_has_vllms_fields():
    body = score_body("score-1", "m", np.array([0.5, 0.25], np.float32), 20, 1700000000)
    assert set(body) == SCORE_FIELDS and body["object"] == "list" and body["created"] == 1700000000
    assert [set(d) for d in body["data"]] == [DATUM_FIELDS] * 2
    assert [d["score"] for d in body["data"]] == [0.5, 0.25] and body["data"][1]["object"] == "score"
    assert body["usage"] == {"prompt_tokens": 20, "total_tokens": 20, "completion_tokens": 0}
